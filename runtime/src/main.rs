//! `tessera`: the one binary. Parses the command line and runs it (see
//! [`runtime::cli`]); errors are printed as one line, and the exit status is
//! non-zero on errors and failed checks.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = runtime::cli::Cli::parse();
    match runtime::cli::run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
