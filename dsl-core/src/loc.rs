//! Source locations: every op records the file, line and column of the Rust
//! expression that created it, so errors point at the kernel author's code.

use std::borrow::Cow;
use std::fmt;

/// A position in a source file (1-based line and column).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Location {
    /// Path of the source file as the compiler reports it.
    pub file: Cow<'static, str>,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl Location {
    /// A location from its parts.
    pub fn new(file: impl Into<Cow<'static, str>>, line: u32, col: u32) -> Location {
        Location { file: file.into(), line, col }
    }

    /// The location of the caller, through `#[track_caller]` chains.
    #[track_caller]
    pub fn caller() -> Location {
        let l = std::panic::Location::caller();
        Location { file: Cow::Borrowed(l.file()), line: l.line(), col: l.column() }
    }

    /// An unknown location (ops created by passes with no better origin).
    pub fn unknown() -> Location {
        Location::default()
    }

    /// True when the location is unknown.
    pub fn is_unknown(&self) -> bool {
        self.file.is_empty() && self.line == 0
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unknown() {
            f.write_str("<unknown>")
        } else {
            write!(f, "{}:{}:{}", self.file, self.line, self.col)
        }
    }
}
