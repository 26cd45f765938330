//! GBNF (llama.cpp's grammar format) read into llguidance's Lark syntax, so
//! `generate --grammar FILE` takes either.
//!
//! The syntax is llama.cpp's: rules `name ::= alternatives`, names of
//! letters, digits and `-`, the start rule `root`; terminals `"..."`
//! (escapes `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`), character
//! classes `[a-z]` / `[^...]`, and `.` (any character); `( )` groups,
//! `|` alternatives, repeats `* + ? {m} {m,} {m,n}`; `#` comments. A rule
//! ends at the end of its line unless a group is still open (newlines
//! inside parentheses and after `|` are white space).
//!
//! The translation is one to one: every rule becomes a Lark rule of the
//! same shape (names made Lark-safe: `g_` + the name with each capital
//! `X` written `_x`, which no other name gives), strings become Lark's
//! JSON-syntax strings, classes and `.` single-character regexes, and
//! `start: g_root`. Undefined rules and a missing `root` are errors here,
//! with the line and column, rather than inside the grammar engine.

use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Whether `text` reads as GBNF rather than Lark: its first rule is
/// introduced by `::=`.
pub fn looks_like_gbnf(text: &str) -> bool {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .find(|l| !l.is_empty())
        .is_some_and(|l| l.contains("::="))
}

/// The Lark grammar equivalent to the GBNF grammar `src`, or an error
/// naming where and why it does not parse.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser { s: src.chars().collect(), i: 0, defined: BTreeSet::new(), used: Vec::new() };
    let mut out = String::new();
    loop {
        p.space(true);
        if p.at_end() {
            break;
        }
        let (line, col) = p.position();
        let name = p.name().ok_or_else(|| p.error("a rule name"))?;
        p.space(false);
        if !p.eat_str("::=") {
            return Err(p.error("`::=` after the rule name"));
        }
        p.space(true);
        let body = p.alternates(false)?;
        if !p.defined.insert(name.clone()) {
            return Err(format!("line {line}, column {col}: rule `{name}` is defined twice"));
        }
        writeln!(out, "{}: {body}", lark_name(&name)).map_err(|e| e.to_string())?;
        p.space(false);
        if !p.at_end() && !p.eat('\n') {
            return Err(p.error("the end of the line after the rule"));
        }
    }
    if !p.defined.contains("root") {
        return Err("the grammar has no `root` rule (the start rule)".into());
    }
    if let Some((name, line, col)) = p.used.iter().find(|(n, _, _)| !p.defined.contains(n)) {
        return Err(format!("line {line}, column {col}: rule `{name}` is used but never defined"));
    }
    Ok(format!("start: {}\n{out}", lark_name("root")))
}

/// The Lark rule name of GBNF rule `name` (see the module doc).
fn lark_name(name: &str) -> String {
    let mut s = String::from("g_");
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            s.push('_');
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

/// A Lark (JSON-syntax) string literal of `text`.
fn lark_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default().replace('\u{7f}', "\\u007f")
}

/// `c` written inside a regex character class.
fn class_char(c: char) -> String {
    match c {
        'a'..='z' | 'A'..='Z' | '0'..='9' | ' ' | '<' | '>' => c.to_string(),
        c if c.is_ascii_graphic() => format!("\\{c}"),
        c => format!("\\x{{{:x}}}", c as u32),
    }
}

struct Parser {
    s: Vec<char>,
    i: usize,
    defined: BTreeSet<String>,
    /// Rules referenced, with the line and column of the first use.
    used: Vec<(String, usize, usize)>,
}

impl Parser {
    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        let hit = self.peek() == Some(c);
        self.i += usize::from(hit);
        hit
    }

    fn eat_str(&mut self, t: &str) -> bool {
        let n = t.chars().count();
        let hit = self.s.len() >= self.i + n && self.s[self.i..self.i + n].iter().copied().eq(t.chars());
        self.i += if hit { n } else { 0 };
        hit
    }

    /// The 1-based line and column of the current position.
    fn position(&self) -> (usize, usize) {
        let before = &self.s[..self.i.min(self.s.len())];
        let line = before.iter().filter(|&&c| c == '\n').count() + 1;
        let col = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
        (line, col)
    }

    fn error(&self, wanted: &str) -> String {
        let (line, col) = self.position();
        let found = match self.peek() {
            None => "the end of the grammar".to_string(),
            Some(c) => format!("{c:?}"),
        };
        format!("line {line}, column {col}: expected {wanted}, found {found}")
    }

    /// Skips blanks and comments, and newlines too with `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.i += 1;
                }
            } else if c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == '-') {
            self.i += 1;
        }
        (self.i > start).then(|| self.s[start..self.i].iter().collect())
    }

    /// `sequence ('|' sequence)*`; inside a group (`nested`) newlines are
    /// white space.
    fn alternates(&mut self, nested: bool) -> Result<String, String> {
        let mut alts = vec![self.sequence(nested)?];
        while self.eat('|') {
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        // An empty alternative is the empty string: the others made optional.
        let (empty, full): (Vec<String>, Vec<String>) = alts.into_iter().partition(|a| a.is_empty());
        Ok(match (empty.is_empty(), full.is_empty()) {
            (true, _) => full.join(" | "),
            (false, true) => "\"\"".into(),
            (false, false) => format!("({})?", full.join(" | ")),
        })
    }

    fn sequence(&mut self, nested: bool) -> Result<String, String> {
        let mut items: Vec<String> = Vec::new();
        loop {
            let item = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('.') => {
                    self.i += 1;
                    "/(?s:.)/".to_string()
                }
                Some('(') => {
                    self.i += 1;
                    self.space(true);
                    let inner = self.alternates(true)?;
                    if !self.eat(')') {
                        return Err(self.error("`)`"));
                    }
                    format!("({inner})")
                }
                Some(c) if c.is_ascii_alphanumeric() || c == '-' => {
                    let (line, col) = self.position();
                    let name = self.name().unwrap_or_default();
                    if !self.used.iter().any(|(n, _, _)| *n == name) {
                        self.used.push((name.clone(), line, col));
                    }
                    lark_name(&name)
                }
                _ => break,
            };
            let rep = self.repeat()?;
            items.push(format!("{item}{rep}"));
            self.space(nested);
        }
        Ok(items.join(" "))
    }

    /// A repeat after an item: `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`.
    fn repeat(&mut self) -> Result<String, String> {
        match self.peek() {
            Some(c @ ('*' | '+' | '?')) => {
                self.i += 1;
                Ok(c.to_string())
            }
            Some('{') => {
                self.i += 1;
                self.space(false);
                let m = self.number()?;
                self.space(false);
                let rep = if self.eat(',') {
                    self.space(false);
                    if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        let n = self.number()?;
                        if n < m {
                            return Err(self.error(&format!("a maximum of at least {m}")));
                        }
                        format!("{{{m},{n}}}")
                    } else {
                        format!("{{{m},}}")
                    }
                } else {
                    format!("{{{m}}}")
                };
                self.space(false);
                if !self.eat('}') {
                    return Err(self.error("`}` closing the repeat"));
                }
                Ok(rep)
            }
            _ => Ok(String::new()),
        }
    }

    fn number(&mut self) -> Result<u32, String> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let digits: String = self.s[start..self.i].iter().collect();
        digits.parse().map_err(|_| self.error("a repeat count"))
    }

    /// One character of a string or class, escapes decoded.
    fn char(&mut self, closing: char) -> Result<char, String> {
        let c = self.peek().ok_or_else(|| self.error(&format!("`{closing}`")))?;
        self.i += 1;
        if c != '\\' {
            return Ok(c);
        }
        let e = self.peek().ok_or_else(|| self.error("an escape"))?;
        self.i += 1;
        let hex = |p: &mut Parser, n: usize| -> Result<char, String> {
            let digits: String = p.s.get(p.i..p.i + n).map(|d| d.iter().collect()).unwrap_or_default();
            let v = u32::from_str_radix(&digits, 16)
                .ok()
                .filter(|_| digits.len() == n)
                .and_then(char::from_u32)
                .ok_or_else(|| p.error(&format!("{n} hex digits of a character")))?;
            p.i += n;
            Ok(v)
        };
        match e {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            _ => {
                self.i -= 1;
                Err(self.error("an escape (\\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)"))
            }
        }
    }

    fn literal(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut text = String::new();
        while self.peek() != Some('"') {
            if self.peek() == Some('\n') || self.at_end() {
                return Err(self.error("`\"` closing the string"));
            }
            text.push(self.char('"')?);
        }
        self.i += 1;
        Ok(lark_string(&text))
    }

    fn class(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut re = String::from("/[");
        if self.eat('^') {
            re.push('^');
        }
        let mut any = false;
        while self.peek() != Some(']') {
            if self.at_end() || self.peek() == Some('\n') {
                return Err(self.error("`]` closing the character class"));
            }
            let lo = self.char(']')?;
            re.push_str(&class_char(lo));
            if self.peek() == Some('-') && self.s.get(self.i + 1).is_some_and(|&c| c != ']' && c != '\n') {
                self.i += 1;
                let hi = self.char(']')?;
                if hi < lo {
                    return Err(self.error(&format!("a range end not below {lo:?}")));
                }
                re.push('-');
                re.push_str(&class_char(hi));
            }
            any = true;
        }
        self.i += 1;
        if !any {
            return Err(self.error("a character class with at least one character"));
        }
        re.push_str("]/");
        Ok(re)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tiny::{tiny_vocab, tiny_vocab_min_size};
    use crate::grammar::{GrammarCompiler, GrammarSpec};
    use crate::tokenizer::Tokenizer;

    /// Whether the GBNF grammar accepts `text` whole, run through llguidance
    /// on the tiny byte-level vocabulary (one token per byte at most).
    fn accepts(g: &GrammarCompiler, tok: &Tokenizer, gbnf: &str, text: &str) -> bool {
        let lark = gbnf_to_lark(gbnf).unwrap_or_else(|e| panic!("{gbnf}: {e}"));
        let mut c = g.compile(&GrammarSpec::Lark(lark.clone())).unwrap_or_else(|e| panic!("{lark}: {e}"));
        tok.encode(text, false).unwrap().into_iter().all(|t| c.consume(t).is_ok()) && c.is_accepting()
    }

    #[test]
    fn translation_is_one_rule_per_rule() {
        let src = "# a comment\nroot ::= greeting (\" \" Name)? # trailing\ngreeting ::= \"hi\" | \"yo\\n\"\nName ::= [A-Z] [a-z\\-]{1,8}\n";
        assert_eq!(
            gbnf_to_lark(src).unwrap(),
            "start: g_root\ng_root: g_greeting (\" \" g__name)?\ng_greeting: \"hi\" | \"yo\\n\"\ng__name: /[AZ]/ /[a-z\\-]/{1,8}\n"
                .replace("[AZ]", "[A-Z]")
        );
        assert!(looks_like_gbnf(src));
        assert!(!looks_like_gbnf("start: \"a\"\n"));
    }

    #[test]
    fn gbnf_grammars_accept_what_llama_cpp_accepts() {
        let tok = Tokenizer::from_vocab(&tiny_vocab(tiny_vocab_min_size()).unwrap()).unwrap();
        let g = GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
        let arith = "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= num | \"(\" expr \")\"\nnum ::= [0-9]+\n";
        for (text, ok) in [("1+2", true), ("(12-3)+4", true), ("1+", false), ("(1", false), ("a", false)] {
            assert_eq!(accepts(&g, &tok, arith, text), ok, "arith {text:?}");
        }
        let classes = "root ::= [^a-c\\n]{2,3} \".\" . \"\\x41\\u00e9\"\n";
        for (text, ok) in [("xy.zAé", true), ("xyz.\nAé", true), ("ax.zAé", false), ("x.zAé", false)] {
            assert_eq!(accepts(&g, &tok, classes, text), ok, "classes {text:?}");
        }
        // An empty alternative, names differing only in case, a group over
        // several lines, a rule used before it is defined.
        let misc = "root ::= (\n  a | A\n) opt\na ::= \"x\"\nA ::= \"y\"\nopt ::= \"!\" | \n";
        for (text, ok) in [("x", true), ("y!", true), ("x!!", false), ("", false)] {
            assert_eq!(accepts(&g, &tok, misc, text), ok, "misc {text:?}");
        }
    }

    #[test]
    fn bad_gbnf_is_an_error_that_says_where() {
        for (src, want) in [
            ("root ::= foo\n", "rule `foo` is used but never defined"),
            ("main ::= \"a\"\n", "no `root` rule"),
            ("root ::= \"abc\n", "line 1, column 14: expected `\"` closing the string"),
            ("root ::= \"a\\q\"\n", "line 1, column 13: expected an escape"),
            ("root ::= [a-\n", "expected `]` closing the character class"),
            ("root ::= \"a\"{3,1}\n", "a maximum of at least 3"),
            ("root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: rule `root` is defined twice"),
            ("root = \"a\"\n", "line 1, column 6: expected `::=`"),
            ("root ::= (\"a\"\n", "expected `)`"),
        ] {
            let e = gbnf_to_lark(src).unwrap_err();
            assert!(e.contains(want), "{src:?}: {e}");
        }
    }
}
