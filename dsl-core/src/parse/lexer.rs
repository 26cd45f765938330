//! The lexer of the IR text: turns the printer's output into tokens with their
//! 1-based line and column (columns count characters, not bytes).
//!
//! Invariants: newlines are tokens (the grammar is line-oriented: an attribute
//! dictionary `{k = v}` stays on its line while a region's `{` ends it); the
//! token list always ends with `Eof`, or with one `Error` token at the first
//! character that cannot start or continue a token, so the parser reports
//! lexical and syntactic errors in text order. Types such as `ptr<f32>` and
//! `tensor<64x32xptr<f16>>` are single tokens whose text the parser splits.

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// A bare word: op mnemonics, dtype names, attribute names and word values,
    /// `kernel`, `loc`.
    Ident(String),
    /// A word immediately followed by `<...>` (through the matching `>`), such as
    /// `ptr<bf16>` or `tensor<64xi32>`: the whole text.
    TypeLit(String),
    /// `%name`: a value (the name without `%`).
    Value(String),
    /// `@name`: the kernel name (without `@`).
    Global(String),
    /// An integer literal, sign included.
    Int(i64),
    /// A float literal (`1.5`, `-2e-7`, `-inf`).
    Float(f64),
    /// A quoted string with Rust `{:?}` escapes, unescaped.
    Str(String),
    /// One of `( ) { } [ ] , : = ^`.
    Punct(char),
    /// The end of a line.
    Newline,
    /// The end of the text.
    Eof,
    /// Text that is not a token; the message says why. Always the last token.
    Error(String),
}

impl Tok {
    /// A short description for error messages ("found ...").
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) | Tok::TypeLit(s) => format!("`{s}`"),
            Tok::Value(s) => format!("`%{s}`"),
            Tok::Global(s) => format!("`@{s}`"),
            Tok::Int(i) => format!("`{i}`"),
            Tok::Float(x) => format!("`{x:?}`"),
            Tok::Str(s) => format!("the string {s:?}"),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Newline => "the end of the line".into(),
            Tok::Eof => "the end of the input".into(),
            Tok::Error(m) => m.clone(),
        }
    }
}

/// A token and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Token {
    /// The token.
    pub tok: Tok,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
}

/// Splits `text` into tokens; see the module invariants.
pub(super) fn lex(text: &str) -> Vec<Token> {
    let mut lx = Lexer { chars: text.chars().collect(), pos: 0, line: 1, col: 1, out: Vec::new() };
    lx.run();
    lx.out
}

/// True for characters of value names and words (`[A-Za-z0-9_]` and other
/// alphanumeric characters, as in Rust identifiers).
fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    line: usize,
    col: usize,
    out: Vec<Token>,
}

impl Lexer {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.chars.get(self.pos + n).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn push(&mut self, tok: Tok, line: usize, col: usize) {
        self.out.push(Token { tok, line, col });
    }

    /// Consumes characters while `pred` holds and returns them.
    fn take_while(&mut self, pred: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek().filter(|&c| pred(c)) {
            s.push(c);
            self.bump();
        }
        s
    }

    fn run(&mut self) {
        loop {
            while matches!(self.peek(), Some(' ' | '\t' | '\r')) {
                self.bump();
            }
            let (line, col) = (self.line, self.col);
            let Some(c) = self.peek() else {
                self.push(Tok::Eof, line, col);
                return;
            };
            let tok = match c {
                '\n' => {
                    self.bump();
                    Ok(Tok::Newline)
                }
                '/' if self.peek_at(1) == Some('/') => {
                    // A comment runs to the end of the line (the newline stays a token).
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                    continue;
                }
                '%' => {
                    self.bump();
                    let name = self.take_while(is_name_char);
                    if name.is_empty() {
                        Err(LexError::new("expected a value name after `%`"))
                    } else {
                        Ok(Tok::Value(name))
                    }
                }
                '@' => {
                    self.bump();
                    let name = self.take_while(|c| !c.is_whitespace() && !"(){},\"".contains(c));
                    if name.is_empty() {
                        Err(LexError::new("expected a kernel name after `@`"))
                    } else {
                        Ok(Tok::Global(name))
                    }
                }
                '"' => self.string(),
                '-' if self.peek_at(1).is_some_and(|c| c.is_ascii_digit()) => self.number(),
                '-' if self.word_at(1, "inf") => {
                    for _ in 0..4 {
                        self.bump();
                    }
                    Ok(Tok::Float(f64::NEG_INFINITY))
                }
                c if c.is_ascii_digit() => self.number(),
                c if is_name_char(c) => self.word(),
                '(' | ')' | '{' | '}' | '[' | ']' | ',' | ':' | '=' | '^' => {
                    self.bump();
                    Ok(Tok::Punct(c))
                }
                other => Err(LexError::new(format!("unexpected character `{}`", other.escape_debug()))),
            };
            match tok {
                Ok(t) => self.push(t, line, col),
                Err(LexError { message, at }) => {
                    let (l, c) = at.unwrap_or((line, col));
                    self.push(Tok::Error(message), l, c);
                    return;
                }
            }
        }
    }

    /// True when the characters at `pos + n` spell `word` and no name character follows.
    fn word_at(&self, n: usize, word: &str) -> bool {
        let mut i = self.pos + n;
        for w in word.chars() {
            if self.chars.get(i) != Some(&w) {
                return false;
            }
            i += 1;
        }
        !self.chars.get(i).is_some_and(|&c| is_name_char(c))
    }

    /// A word, or a type literal when `<` follows immediately.
    fn word(&mut self) -> Result<Tok, LexError> {
        let mut s = self.take_while(is_name_char);
        if self.peek() != Some('<') {
            return Ok(Tok::Ident(s));
        }
        let mut depth = 0usize;
        loop {
            match self.peek() {
                Some('<') => depth += 1,
                Some('>') => depth -= 1,
                Some(c) if c == '\n' || c.is_whitespace() => {
                    return Err(LexError::new(format!("unterminated type `{s}`: expected `>`")));
                }
                None => return Err(LexError::new(format!("unterminated type `{s}`: expected `>`"))),
                Some(_) => {}
            }
            if let Some(c) = self.bump() {
                s.push(c);
            }
            if depth == 0 {
                return Ok(Tok::TypeLit(s));
            }
        }
    }

    /// `-?[0-9]+(.[0-9]+)?([eE][+-]?[0-9]+)?`: an `Int` without fraction or exponent.
    fn number(&mut self) -> Result<Tok, LexError> {
        let mut s = String::new();
        if self.peek() == Some('-') {
            self.bump();
            s.push('-');
        }
        s.push_str(&self.take_while(|c| c.is_ascii_digit()));
        let mut is_float = false;
        if self.peek() == Some('.') && self.peek_at(1).is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
            s.push('.');
            s.push_str(&self.take_while(|c| c.is_ascii_digit()));
            is_float = true;
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let digit_at = |n: usize| self.peek_at(n).is_some_and(|c| c.is_ascii_digit());
            let signed = matches!(self.peek_at(1), Some('+' | '-'));
            if digit_at(1) || (signed && digit_at(2)) {
                s.push('e');
                self.bump();
                if signed && let Some(c) = self.bump() {
                    s.push(c);
                }
                s.push_str(&self.take_while(|c| c.is_ascii_digit()));
                is_float = true;
            }
        }
        if self.peek().is_some_and(|c| is_name_char(c) || c == '.') {
            return Err(LexError::new(format!("malformed number `{s}{}`", self.peek().unwrap_or(' '))));
        }
        if is_float {
            match s.parse::<f64>() {
                Ok(x) if x.is_finite() => Ok(Tok::Float(x)),
                _ => Err(LexError::new(format!("float literal `{s}` is out of range"))),
            }
        } else {
            s.parse::<i64>()
                .map(Tok::Int)
                .map_err(|_| LexError::new(format!("integer literal `{s}` does not fit in i64")))
        }
    }

    /// A string with Rust `{:?}` escapes: `\n \r \t \\ \" \' \0 \u{XXXX}`.
    fn string(&mut self) -> Result<Tok, LexError> {
        self.bump();
        let mut s = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => {
                    return Err(LexError::new("unterminated string: expected a closing `\"`"));
                }
                Some('"') => {
                    self.bump();
                    return Ok(Tok::Str(s));
                }
                Some('\\') => {
                    let c = match self.peek_at(1) {
                        Some('n') => '\n',
                        Some('r') => '\r',
                        Some('t') => '\t',
                        Some('\\') => '\\',
                        Some('"') => '"',
                        Some('\'') => '\'',
                        Some('0') => '\0',
                        Some('u') => {
                            let err = self.here("malformed `\\u{...}` escape");
                            self.bump();
                            self.bump();
                            s.push(self.unicode_escape().ok_or(err)?);
                            continue;
                        }
                        Some(other) => {
                            return Err(self.here(format!("unknown escape `\\{}`", other.escape_debug())));
                        }
                        None => return Err(LexError::new("unterminated string: expected a closing `\"`")),
                    };
                    self.bump();
                    self.bump();
                    s.push(c);
                }
                Some(c) => {
                    self.bump();
                    s.push(c);
                }
            }
        }
    }

    /// The `{XXXX}` part of a `\u{XXXX}` escape.
    fn unicode_escape(&mut self) -> Option<char> {
        if self.peek() != Some('{') {
            return None;
        }
        self.bump();
        let hex = self.take_while(|c| c.is_ascii_hexdigit());
        if self.peek() != Some('}') || hex.is_empty() || hex.len() > 6 {
            return None;
        }
        self.bump();
        u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32)
    }

    /// An error at the current character (inside the token being lexed).
    fn here(&self, message: impl Into<String>) -> LexError {
        LexError { message: message.into(), at: Some((self.line, self.col)) }
    }
}

/// A lexical error; `at` is where it is when not at the token's start.
struct LexError {
    message: String,
    at: Option<(usize, usize)>,
}

impl LexError {
    /// An error at the start of the token.
    fn new(message: impl Into<String>) -> LexError {
        LexError { message: message.into(), at: None }
    }
}
