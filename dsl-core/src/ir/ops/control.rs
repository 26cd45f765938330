//! Structured control flow (scf-style) and block terminators.
//!
//! - `for lb, ub, step, init...`: one region whose block takes
//!   `(iv, carried...)` and ends with `yield carried...`; runs while `iv < ub`
//!   (`step` must be positive); results are the final carried values.
//! - `if cond`: two regions (then, else) with no block arguments, each ending
//!   with `yield` of the op's result types.
//! - `while init...`: region 0 ("before") takes the carried values and ends
//!   with `condition c, forwarded...`; when `c` is true region 1 ("after")
//!   takes the forwarded values and ends with `yield` of new carried values;
//!   when false the forwarded values are the results.
//!
//! Regions may use values defined in enclosing regions.

use super::expect_args;
use crate::dtype::Type;

/// The control family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlOp {
    /// Counted loop with loop-carried values.
    For,
    /// Two-way branch with results.
    If,
    /// Condition-controlled loop.
    While,
    /// Terminator of `for`/`if`/`while`-after and combine regions.
    Yield,
    /// Terminator of the `while` "before" region: `condition c, forwarded...`.
    Condition,
}

mnemonics! { ControlOp:
    For = "for", If = "if", While = "while", Yield = "yield", Condition = "condition",
}

impl ControlOp {
    /// Parses a mnemonic of this family.
    pub fn parse(name: &str) -> Option<ControlOp> {
        Some(match name {
            "for" => ControlOp::For,
            "if" => ControlOp::If,
            "while" => ControlOp::While,
            "yield" => ControlOp::Yield,
            "condition" => ControlOp::Condition,
            _ => return None,
        })
    }

    /// Checks the operands of an `if`: one scalar `i1` condition. (Its
    /// result types are declared by the op; the verifier checks them
    /// against its regions.)
    pub fn check_if_operands(args: &[Type]) -> Result<(), String> {
        expect_args("if", args, 1)?;
        if !args[0].is_scalar() || !args[0].is_bool() {
            return Err(format!("`if` condition must be a scalar i1, found {}", args[0]));
        }
        Ok(())
    }

    /// Result types as far as operands decide them: `for` returns its carried
    /// types, terminators return nothing; `if` and `while` results are declared
    /// by the op and checked against the regions by the verifier.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        match self {
            ControlOp::For => {
                if args.len() < 3 {
                    return Err("`for` needs lower bound, upper bound and step".into());
                }
                for (t, what) in args[..3].iter().zip(["lower bound", "upper bound", "step"]) {
                    if !t.is_scalar() || !t.is_int() || t.is_bool() {
                        return Err(format!("`for` {what} must be an integer scalar, found {t}"));
                    }
                }
                if args[0] != args[1] || args[0] != args[2] {
                    return Err(format!(
                        "`for` bounds and step must share a type: {}, {}, {}",
                        args[0], args[1], args[2]
                    ));
                }
                Ok(args[3..].to_vec())
            }
            ControlOp::If => {
                Self::check_if_operands(args)?;
                Err("`if` result types are declared, not inferred".into())
            }
            ControlOp::While => Err("`while` result types are declared, not inferred".into()),
            ControlOp::Yield => Ok(Vec::new()),
            ControlOp::Condition => {
                match args.first() {
                    Some(t) if t.is_scalar() && t.is_bool() => {}
                    Some(t) => return Err(format!("`condition` needs a scalar i1 first, found {t}")),
                    None => return Err("`condition` needs a scalar i1 operand".into()),
                }
                Ok(Vec::new())
            }
        }
    }
}
