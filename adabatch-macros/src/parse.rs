//! Syntax of the attribute arguments.
//!
//! The grammar here is deliberately loose: it accepts every `key = value` list whose
//! values are literals, paths or calls, so that `attr` can interpret each key on
//! its own and report *all* mistakes of one attribute together, each on its token.
//!
//! ```text
//! args     := arg (',' arg)* ','?
//! arg      := key ('=' value)?              key: any identifier, `crate` included
//! value    := literal | path ('(' call_arg (',' call_arg)* ','? ')')?
//! call_arg := ident '=' value               over = 10, threshold = 0.9, global = 64
//!           | ('+' | '-' | '*') value       +1, -2, *2
//!           | value '=>' value              0 => 8
//!           | value
//! ```

use proc_macro2::{Punct, Spacing, Span, TokenStream};
use quote::{ToTokens, TokenStreamExt};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{token, Ident, Lit, Path, Token};

/// The whole argument list of `#[adaptive_trainer(...)]`.
#[derive(Debug, Clone)]
pub struct AttrArgs {
    /// The arguments in source order (duplicates included: `attr` reports them).
    pub args: Vec<Arg>,
}

/// One `key = value` (or a bare `key`, which `attr` rejects with a hint).
#[derive(Debug, Clone)]
pub struct Arg {
    /// The key as written (`crate` is accepted as an identifier).
    pub key: Ident,
    /// `=` and the value, absent for a bare key.
    pub value: Option<(Token![=], Value)>,
}

/// A value: a literal, a path, or a call `name(args)`.
#[derive(Debug, Clone)]
pub enum Value {
    /// `3`, `0.9`, `true`, `"::adabatch"`.
    Lit(Lit),
    /// `sample_count`, `my::path`.
    Path(Path),
    /// `interval(5, +1)`.
    Call(Call),
}

/// `name(arg, ...)`.
#[derive(Debug, Clone)]
pub struct Call {
    /// The callee (`interval`, `fixed`, ...).
    pub name: Path,
    /// The parentheses, for errors about the argument list as a whole.
    pub paren: token::Paren,
    /// The arguments.
    pub args: Punctuated<CallArg, Token![,]>,
}

/// One argument of a [`Call`].
#[derive(Debug, Clone)]
pub enum CallArg {
    /// `name = value`.
    Named {
        /// The argument's name.
        name: Ident,
        /// `=`.
        eq: Token![=],
        /// Its value.
        value: Value,
    },
    /// `+value`, `-value`, `*value`.
    Op {
        /// The operator.
        op: Op,
        /// The operand.
        value: Value,
    },
    /// `lhs => rhs`.
    Arrow {
        /// Left-hand side.
        lhs: Value,
        /// `=>`.
        arrow: Token![=>],
        /// Right-hand side.
        rhs: Value,
    },
    /// A plain value.
    Plain(Value),
}

/// The operator of [`CallArg::Op`].
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// `+`
    Add(Span),
    /// `-`
    Sub(Span),
    /// `*`
    Mul(Span),
}

impl Parse for AttrArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let args = Punctuated::<Arg, Token![,]>::parse_terminated(input)?;
        Ok(AttrArgs {
            args: args.into_iter().collect(),
        })
    }
}

impl Parse for Arg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let lookahead = input.lookahead1();
        if !lookahead.peek(Ident::peek_any) {
            return Err(syn::Error::new(
                input.span(),
                "expected `key = value`, e.g. `schedule = interval(5, +1)`",
            ));
        }
        let key = Ident::parse_any(input)?;
        let value = if input.peek(Token![=]) && !input.peek(Token![=>]) {
            let eq: Token![=] = input.parse()?;
            if input.is_empty() || input.peek(Token![,]) {
                return Err(syn::Error::new(
                    eq.span,
                    format!("expected a value after `{key} =`"),
                ));
            }
            Some((eq, input.parse()?))
        } else if input.is_empty() || input.peek(Token![,]) {
            None
        } else {
            return Err(syn::Error::new(
                input.span(),
                format!("expected `=` after `{key}`"),
            ));
        };
        Ok(Arg { key, value })
    }
}

impl Parse for Value {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(Lit) {
            return input.parse().map(Value::Lit);
        }
        if input.peek(Ident::peek_any) || input.peek(Token![::]) {
            let name: Path = input.parse()?;
            if input.peek(token::Paren) {
                let content;
                let paren = syn::parenthesized!(content in input);
                let args = Punctuated::parse_terminated(&content)?;
                return Ok(Value::Call(Call { name, paren, args }));
            }
            return Ok(Value::Path(name));
        }
        Err(syn::Error::new(
            input.span(),
            "expected a value: a literal, a name or a call like `interval(5, +1)`",
        ))
    }
}

impl Parse for CallArg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(Ident) && input.peek2(Token![=]) && !input.peek2(Token![=>]) {
            return Ok(CallArg::Named {
                name: input.parse()?,
                eq: input.parse()?,
                value: input.parse()?,
            });
        }
        let op = if input.peek(Token![+]) {
            Some(Op::Add(input.parse::<Token![+]>()?.span))
        } else if input.peek(Token![-]) {
            Some(Op::Sub(input.parse::<Token![-]>()?.span))
        } else if input.peek(Token![*]) {
            Some(Op::Mul(input.parse::<Token![*]>()?.span))
        } else {
            None
        };
        if let Some(op) = op {
            return Ok(CallArg::Op {
                op,
                value: input.parse()?,
            });
        }
        let lhs: Value = input.parse()?;
        if input.peek(Token![=>]) {
            return Ok(CallArg::Arrow {
                lhs,
                arrow: input.parse()?,
                rhs: input.parse()?,
            });
        }
        Ok(CallArg::Plain(lhs))
    }
}

impl Value {
    /// A short description of what was written, for "found ..." in messages.
    pub fn describe(&self) -> String {
        match self {
            Value::Lit(Lit::Int(i)) => format!("integer `{}`", i.base10_digits()),
            Value::Lit(Lit::Float(f)) => format!("float `{}`", f.base10_digits()),
            Value::Lit(Lit::Bool(b)) => format!("`{}`", b.value),
            Value::Lit(Lit::Str(s)) => format!("string {:?}", s.value()),
            Value::Lit(_) => "a literal".to_string(),
            Value::Path(p) => format!("`{}`", path_to_string(p)),
            Value::Call(c) => format!("`{}(..)`", path_to_string(&c.name)),
        }
    }

    /// The single identifier this value is, if it is one (`sample_count`).
    pub fn as_ident(&self) -> Option<&Ident> {
        match self {
            Value::Path(p) => p.get_ident(),
            _ => None,
        }
    }
}

impl ToTokens for Value {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        match self {
            Value::Lit(lit) => lit.to_tokens(tokens),
            Value::Path(path) => path.to_tokens(tokens),
            Value::Call(call) => {
                call.name.to_tokens(tokens);
                call.paren
                    .surround(tokens, |inner| call.args.to_tokens(inner));
            }
        }
    }
}

impl ToTokens for CallArg {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        match self {
            CallArg::Named { name, eq, value } => {
                name.to_tokens(tokens);
                eq.to_tokens(tokens);
                value.to_tokens(tokens);
            }
            CallArg::Op { op, value } => {
                let (ch, span) = match *op {
                    Op::Add(s) => ('+', s),
                    Op::Sub(s) => ('-', s),
                    Op::Mul(s) => ('*', s),
                };
                let mut punct = Punct::new(ch, Spacing::Alone);
                punct.set_span(span);
                tokens.append(punct);
                value.to_tokens(tokens);
            }
            CallArg::Arrow { lhs, arrow, rhs } => {
                lhs.to_tokens(tokens);
                arrow.to_tokens(tokens);
                rhs.to_tokens(tokens);
            }
            CallArg::Plain(value) => value.to_tokens(tokens),
        }
    }
}

impl ToTokens for Arg {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        self.key.to_tokens(tokens);
        if let Some((eq, value)) = &self.value {
            eq.to_tokens(tokens);
            value.to_tokens(tokens);
        }
    }
}

/// `a::b::c` as written (without spaces), for messages.
pub fn path_to_string(path: &Path) -> String {
    let mut s = String::new();
    if path.leading_colon.is_some() {
        s.push_str("::");
    }
    for (i, seg) in path.segments.iter().enumerate() {
        if i > 0 {
            s.push_str("::");
        }
        s.push_str(&seg.ident.to_string());
        if !seg.arguments.is_none() {
            s.push_str("<..>");
        }
    }
    s
}
