//! Compile-time shape checking: where tile shapes are fixed by literals (or by
//! `let` bindings of literal integers), broadcast mismatches, `dot` inner
//! dimension mismatches and bad reshapes are reported at `cargo build`, spanned
//! at the offending expression. Everything the check cannot see statically is
//! left to the builder, which reports the same errors at `build()` with the
//! kernel source location.
//!
//! The analysis is deliberately conservative: an expression whose shape is not
//! known from literals is `Unknown` and never produces an error.

use crate::signature::Errors;
use std::collections::HashMap;
use syn::spanned::Spanned;
use syn::{BinOp, Block, Expr, Pat, Stmt};

/// What the checker knows about a value.
#[derive(Clone, Debug, PartialEq)]
enum Abs {
    /// A build-time integer with a known value.
    Int(i64),
    /// A scalar (rank 0) whose value is unknown.
    Scalar,
    /// A tile with a known logical shape.
    Tile(Vec<usize>),
    /// Nothing known.
    Unknown,
}

struct Checker<'e> {
    scopes: Vec<HashMap<String, Abs>>,
    errors: &'e mut Errors,
}

/// Checks `body` with the runtime parameters `scalars` (known to be scalars).
pub fn check(body: &Block, scalars: &[String], errors: &mut Errors) {
    let mut top = HashMap::new();
    for s in scalars {
        top.insert(s.clone(), Abs::Scalar);
    }
    let mut c = Checker { scopes: vec![top], errors };
    c.block(body);
}

fn shape_str(s: &[usize]) -> String {
    format!("[{}]", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

impl Checker<'_> {
    fn lookup(&self, name: &str) -> Abs {
        for s in self.scopes.iter().rev() {
            if let Some(v) = s.get(name) {
                return v.clone();
            }
        }
        Abs::Unknown
    }

    fn bind(&mut self, name: String, v: Abs) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name, v);
        }
    }

    /// Forgets what is known about a reassigned variable, everywhere it is visible.
    fn forget(&mut self, name: &str) {
        for s in self.scopes.iter_mut().rev() {
            if let Some(v) = s.get_mut(name) {
                *v = Abs::Unknown;
                return;
            }
        }
    }

    fn block(&mut self, b: &Block) -> Abs {
        self.scopes.push(HashMap::new());
        let mut last = Abs::Unknown;
        for s in &b.stmts {
            last = match s {
                Stmt::Local(l) => {
                    let v = l.init.as_ref().map(|i| self.expr(&i.expr)).unwrap_or(Abs::Unknown);
                    let pat = match &l.pat {
                        Pat::Type(pt) => &*pt.pat,
                        p => p,
                    };
                    if let Pat::Ident(pi) = pat {
                        // A `let mut` may change later (possibly in a loop): only
                        // immutable bindings keep what is known.
                        let v = if pi.mutability.is_some() { Abs::Unknown } else { v };
                        self.bind(pi.ident.to_string(), v);
                    }
                    Abs::Unknown
                }
                Stmt::Expr(e, semi) => {
                    let v = self.expr(e);
                    if semi.is_some() { Abs::Unknown } else { v }
                }
                _ => Abs::Unknown,
            };
        }
        self.scopes.pop();
        last
    }

    fn int(&mut self, e: &Expr) -> Option<i64> {
        match self.expr(e) {
            Abs::Int(i) => Some(i),
            _ => None,
        }
    }

    fn expr(&mut self, e: &Expr) -> Abs {
        match e {
            Expr::Lit(l) => match &l.lit {
                syn::Lit::Int(i) => i.base10_parse().map(Abs::Int).unwrap_or(Abs::Scalar),
                _ => Abs::Scalar,
            },
            Expr::Path(p) => match p.path.get_ident() {
                Some(i) => self.lookup(&i.to_string()),
                None => Abs::Unknown,
            },
            Expr::Paren(p) => self.expr(&p.expr),
            Expr::Group(g) => self.expr(&g.expr),
            Expr::Unary(u) => match (self.expr(&u.expr), &u.op) {
                (Abs::Int(i), syn::UnOp::Neg(_)) => Abs::Int(-i),
                (v, _) => v,
            },
            Expr::Binary(b) => self.binary(b),
            Expr::Assign(a) => {
                self.expr(&a.right);
                if let Expr::Path(p) = &*a.left
                    && let Some(i) = p.path.get_ident()
                {
                    self.forget(&i.to_string());
                }
                Abs::Unknown
            }
            Expr::Call(c) => self.call(c),
            Expr::MethodCall(m) => {
                let recv = self.expr(&m.receiver);
                for a in &m.args {
                    self.expr(a);
                }
                match (m.method.to_string().as_str(), recv) {
                    (
                        "to" | "exp" | "exp2" | "log" | "log2" | "sqrt" | "rsqrt" | "abs" | "sin" | "cos"
                        | "tanh" | "sigmoid",
                        v,
                    ) => v,
                    _ => Abs::Unknown,
                }
            }
            Expr::If(i) => {
                self.expr(&i.cond);
                self.block(&i.then_branch);
                if let Some((_, e)) = &i.else_branch {
                    self.expr(e);
                }
                Abs::Unknown
            }
            Expr::Block(b) => self.block(&b.block),
            Expr::ForLoop(f) => {
                self.expr(&f.expr);
                self.scopes.push(HashMap::new());
                if let Pat::Ident(pi) = &*f.pat {
                    self.bind(pi.ident.to_string(), Abs::Scalar);
                }
                self.block(&f.body);
                self.scopes.pop();
                Abs::Unknown
            }
            Expr::While(w) => {
                self.expr(&w.cond);
                self.block(&w.body);
                Abs::Unknown
            }
            _ => Abs::Unknown,
        }
    }

    /// The broadcast of two known shapes; reports a mismatch at `span`.
    fn broadcast(&mut self, a: Abs, b: Abs, span: proc_macro2::Span) -> Abs {
        let (sa, sb) = match (&a, &b) {
            (Abs::Tile(x), Abs::Tile(y)) => (x.clone(), y.clone()),
            (Abs::Tile(x), Abs::Int(_) | Abs::Scalar) | (Abs::Int(_) | Abs::Scalar, Abs::Tile(x)) => {
                return Abs::Tile(x.clone());
            }
            (Abs::Int(_) | Abs::Scalar, Abs::Int(_) | Abs::Scalar) => return Abs::Scalar,
            _ => return Abs::Unknown,
        };
        let rank = sa.len().max(sb.len());
        let pad = |s: &[usize]| -> Vec<usize> {
            let mut v = vec![1; rank - s.len()];
            v.extend_from_slice(s);
            v
        };
        let (pa, pb) = (pad(&sa), pad(&sb));
        let mut out = Vec::new();
        for i in 0..rank {
            match (pa[i], pb[i]) {
                (x, y) if x == y || y == 1 => out.push(x),
                (1, y) => out.push(y),
                (x, y) => {
                    self.errors.at_span(
                        span,
                        format!(
                            "shapes {} and {} cannot be broadcast: dimension {i} is {x} vs {y}",
                            shape_str(&sa),
                            shape_str(&sb)
                        ),
                    );
                    return Abs::Unknown;
                }
            }
        }
        Abs::Tile(out)
    }

    fn binary(&mut self, b: &syn::ExprBinary) -> Abs {
        let (l, r) = (self.expr(&b.left), self.expr(&b.right));
        // Build-time integer arithmetic, so `let B = 2 * 64;` stays known.
        if let (Abs::Int(x), Abs::Int(y)) = (&l, &r) {
            let v = match b.op {
                BinOp::Add(_) => x.checked_add(*y),
                BinOp::Sub(_) => x.checked_sub(*y),
                BinOp::Mul(_) => x.checked_mul(*y),
                BinOp::Div(_) if *y != 0 => Some(x / y),
                _ => None,
            };
            return v.map(Abs::Int).unwrap_or(Abs::Unknown);
        }
        if matches!(
            b.op,
            BinOp::AddAssign(_)
                | BinOp::SubAssign(_)
                | BinOp::MulAssign(_)
                | BinOp::DivAssign(_)
                | BinOp::RemAssign(_)
                | BinOp::BitAndAssign(_)
                | BinOp::BitOrAssign(_)
                | BinOp::BitXorAssign(_)
                | BinOp::ShlAssign(_)
                | BinOp::ShrAssign(_)
        ) {
            self.broadcast(l, r, b.span());
            if let Expr::Path(p) = &*b.left
                && let Some(i) = p.path.get_ident()
            {
                self.forget(&i.to_string());
            }
            return Abs::Unknown;
        }
        self.broadcast(l, r, b.span())
    }

    fn call(&mut self, c: &syn::ExprCall) -> Abs {
        let name = match &*c.func {
            Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
            _ => None,
        };
        let pos: Vec<&Expr> = c.args.iter().filter(|a| !matches!(a, Expr::Assign(_))).collect();
        let Some(name) = name else {
            for a in &c.args {
                self.expr(a);
            }
            return Abs::Unknown;
        };
        match name.as_str() {
            "arange" if pos.len() == 2 => match (self.int(pos[0]), self.int(pos[1])) {
                (Some(a), Some(b)) if b > a => Abs::Tile(vec![(b - a) as usize]),
                _ => Abs::Unknown,
            },
            "zeros" | "full" if !pos.is_empty() => {
                let Expr::Array(arr) = pos[0] else { return Abs::Unknown };
                let dims: Option<Vec<usize>> =
                    arr.elems.iter().map(|d| self.int(d).and_then(|v| usize::try_from(v).ok())).collect();
                dims.map(Abs::Tile).unwrap_or(Abs::Unknown)
            }
            "program_id" | "num_programs" => Abs::Scalar,
            "load" if !pos.is_empty() => {
                let mut v = self.expr(pos[0]);
                for a in c.args.iter().skip(1) {
                    let w = match a {
                        Expr::Assign(asg) => self.expr(&asg.right),
                        other => self.expr(other),
                    };
                    if matches!(w, Abs::Tile(_)) {
                        v = self.broadcast(v, w, a.span());
                    }
                }
                if let Abs::Int(_) = v { Abs::Scalar } else { v }
            }
            "load_block" => {
                // The block (the last positional argument) is the tile shape;
                // the other arguments are scalars.
                for a in pos.iter().take(pos.len().saturating_sub(1)) {
                    self.expr(a);
                }
                let Some(Expr::Array(arr)) = pos.last().filter(|_| pos.len() == 7) else {
                    return Abs::Unknown;
                };
                let dims: Option<Vec<usize>> =
                    arr.elems.iter().map(|d| self.int(d).and_then(|v| usize::try_from(v).ok())).collect();
                dims.filter(|d| d.len() == 2).map(Abs::Tile).unwrap_or(Abs::Unknown)
            }
            "expand_dims" if pos.len() == 2 => match (self.expr(pos[0]), self.int(pos[1])) {
                (Abs::Tile(mut s), Some(ax)) if ax >= 0 && (ax as usize) <= s.len() => {
                    s.insert(ax as usize, 1);
                    Abs::Tile(s)
                }
                _ => Abs::Unknown,
            },
            "sum" | "max" | "min" | "argmax" | "argmin" if !pos.is_empty() => {
                let axis = pos.get(1).and_then(|a| self.int(a)).unwrap_or(0);
                match self.expr(pos[0]) {
                    Abs::Tile(mut s) if axis >= 0 && (axis as usize) < s.len() => {
                        s.remove(axis as usize);
                        if s.is_empty() { Abs::Scalar } else { Abs::Tile(s) }
                    }
                    _ => Abs::Unknown,
                }
            }
            "exp" | "exp2" | "log" | "log2" | "sqrt" | "rsqrt" | "abs" | "sin" | "cos" | "tanh"
            | "sigmoid" | "cumsum" | "cast" | "floor" | "ceil" | "erf" | "multiple_of" | "max_contiguous"
            | "max_constancy"
                if !pos.is_empty() =>
            {
                for a in pos.iter().skip(1) {
                    self.expr(a);
                }
                self.expr(pos[0])
            }
            "trans" if pos.len() == 1 => match self.expr(pos[0]) {
                Abs::Tile(s) if s.len() == 2 => Abs::Tile(vec![s[1], s[0]]),
                _ => Abs::Unknown,
            },
            "minimum" | "maximum" | "where_" | "select" | "fma" | "dp4a" | "pow" => {
                let vals: Vec<(Abs, proc_macro2::Span)> =
                    pos.iter().map(|a| (self.expr(a), a.span())).collect();
                let mut acc = Abs::Scalar;
                for (v, _) in vals {
                    acc = self.broadcast(acc, v, c.span());
                }
                acc
            }
            "dot" if pos.len() >= 2 => {
                let (a, b) = (self.expr(pos[0]), self.expr(pos[1]));
                let acc = pos.get(2).map(|x| self.expr(x));
                match (&a, &b) {
                    (Abs::Tile(sa), Abs::Tile(sb)) if sa.len() == 2 && sb.len() == 2 => {
                        if sa[1] != sb[0] {
                            self.errors.at_span(
                                c.span(),
                                format!(
                                    "`dot` inner dimensions differ: a is {} and b is {} (K {} vs {})",
                                    shape_str(sa),
                                    shape_str(sb),
                                    sa[1],
                                    sb[0]
                                ),
                            );
                            return Abs::Unknown;
                        }
                        let out = vec![sa[0], sb[1]];
                        if let Some(Abs::Tile(sc)) = &acc
                            && *sc != out
                        {
                            self.errors.at_span(
                                c.span(),
                                format!(
                                    "`dot` accumulator must be {}, found {}",
                                    shape_str(&out),
                                    shape_str(sc)
                                ),
                            );
                        }
                        Abs::Tile(out)
                    }
                    _ => Abs::Unknown,
                }
            }
            "reshape" if pos.len() == 2 => {
                let v = self.expr(pos[0]);
                let Expr::Array(arr) = pos[1] else { return Abs::Unknown };
                let dims: Option<Vec<usize>> =
                    arr.elems.iter().map(|d| self.int(d).and_then(|v| usize::try_from(v).ok())).collect();
                match (v, dims) {
                    (Abs::Tile(s), Some(d)) => {
                        let (n, m) = (s.iter().product::<usize>(), d.iter().product::<usize>());
                        if n != m {
                            self.errors.at_span(
                                c.span(),
                                format!(
                                    "`reshape` keeps the element count: {} has {n} elements but {} has {m}",
                                    shape_str(&s),
                                    shape_str(&d)
                                ),
                            );
                            return Abs::Unknown;
                        }
                        Abs::Tile(d)
                    }
                    _ => Abs::Unknown,
                }
            }
            _ => {
                for a in &c.args {
                    self.expr(a);
                }
                Abs::Unknown
            }
        }
    }
}
