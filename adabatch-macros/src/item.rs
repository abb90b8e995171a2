//! The item under the attribute: a struct with named fields, and the roles of its
//! fields (`#[model]`, `#[optimizer]`, `#[regressor]`, `#[callback]`, `#[mixer]`),
//! which are stripped from the struct that is emitted; [`Parts`], the marked fields
//! as the spec carries them.

use std::collections::HashMap;

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::{Attribute, Fields, Ident, Item, ItemStruct, Meta, Type};

use crate::attr::suggest::did_you_mean;
use crate::ctxt::Ctxt;

/// The field attributes.
pub const FIELD_ATTRS: &[&str] = &["model", "optimizer", "regressor", "callback", "mixer"];

/// The marked fields of a trainer.
#[derive(Debug, Clone)]
pub struct Parts {
    /// The `#[model]` field.
    pub model: FieldRef,
    /// The `#[optimizer]` field.
    pub optimizer: FieldRef,
    /// The `#[regressor]` field, if any.
    pub regressor: Option<FieldRef>,
    /// The `#[callback]` field, if any.
    pub callback: Option<FieldRef>,
    /// The `#[mixer]` field, if any.
    pub mixer: Option<FieldRef>,
}

/// A marked field.
#[derive(Debug, Clone)]
pub struct FieldRef {
    /// Its name.
    pub ident: Ident,
    /// Its type (spans point into the user's struct).
    pub ty: Type,
}

/// The marked fields of a valid struct.
pub struct Roles {
    /// `#[model]`, `#[optimizer]`, `#[regressor]`, `#[callback]`, `#[mixer]`.
    pub parts: Parts,
    /// The `#[regressor]` attribute, for errors about it.
    pub regressor_attr: Option<Attribute>,
}

/// What the item turned out to be (built once per expansion: size does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Shape {
    /// A struct (field attributes stripped), with its roles when they are valid.
    Struct(ItemStruct, Option<Roles>),
    /// Anything else, as tokens to emit unchanged (field attributes stripped).
    Other(TokenStream),
}

const NEEDS_NAMED: &str =
    "`#[adaptive_trainer]` needs a struct with named fields, one `#[model]` and one `#[optimizer]`";

/// Checks the item's shape and its field attributes; strips the attributes.
pub fn parse_item(item: Item, cx: &mut Ctxt) -> Shape {
    match item {
        Item::Struct(mut s) => {
            let fields = match &mut s.fields {
                Fields::Named(named) => field_attrs(&s.ident, &mut named.named, cx),
                Fields::Unnamed(unnamed) => {
                    cx.at(unnamed.paren_token.span.join(), format!("{NEEDS_NAMED}; found a tuple struct: name its fields, as in `struct Trainer {{ #[model] model: M, #[optimizer] opt: O }}`"));
                    // Strip the roles; their mistakes are not reported on top.
                    let mut ignored = Ctxt::new();
                    let _ = field_attrs(&s.ident, &mut unnamed.unnamed, &mut ignored);
                    let _ = ignored.check();
                    None
                }
                Fields::Unit => {
                    cx.at(
                        s.ident.span(),
                        format!("{NEEDS_NAMED}; found a unit struct"),
                    );
                    None
                }
            };
            Shape::Struct(s, fields)
        }
        Item::Enum(mut e) => {
            cx.at(e.enum_token.span, format!("{NEEDS_NAMED}; found an enum"));
            for variant in &mut e.variants {
                for field in variant.fields.iter_mut() {
                    field.attrs.retain(|a| !is_field_attr(a));
                }
            }
            Shape::Other(e.into_token_stream())
        }
        Item::Union(mut u) => {
            cx.at(u.union_token.span, format!("{NEEDS_NAMED}; found a union"));
            for field in u.fields.named.iter_mut() {
                field.attrs.retain(|a| !is_field_attr(a));
            }
            Shape::Other(u.into_token_stream())
        }
        other => {
            cx.on(
                item_head(&other),
                format!("{NEEDS_NAMED}; it cannot be applied to this item"),
            );
            Shape::Other(other.into_token_stream())
        }
    }
}

fn item_head(item: &Item) -> TokenStream {
    match item {
        Item::Fn(f) => f.sig.to_token_stream(),
        Item::Impl(i) => i.impl_token.to_token_stream(),
        Item::Trait(t) => t.trait_token.to_token_stream(),
        Item::Mod(m) => m.mod_token.to_token_stream(),
        other => other.to_token_stream(),
    }
}

fn attr_name(attr: &Attribute) -> Option<String> {
    attr.path().get_ident().map(ToString::to_string)
}

fn is_field_attr(attr: &Attribute) -> bool {
    attr_name(attr).is_some_and(|n| FIELD_ATTRS.contains(&n.as_str()))
}

/// A near miss of a field attribute, `#[modle]`: stripped, reported with a hint.
fn near_miss(attr: &Attribute) -> Option<&'static str> {
    let name = attr_name(attr)?;
    if FIELD_ATTRS.contains(&name.as_str()) || BUILTIN_ATTRS.contains(&name.as_str()) {
        return None;
    }
    did_you_mean(&name, FIELD_ATTRS)
}

const BUILTIN_ATTRS: &[&str] = &[
    "doc",
    "cfg",
    "cfg_attr",
    "allow",
    "warn",
    "deny",
    "expect",
    "forbid",
    "deprecated",
    "must_use",
];

/// Finds the roles of the fields and strips their attributes.
fn field_attrs(
    ident: &Ident,
    fields: &mut Punctuated<syn::Field, syn::token::Comma>,
    cx: &mut Ctxt,
) -> Option<Roles> {
    let mut scan = RoleScan {
        found: HashMap::new(),
        attempted: Vec::new(),
        ok: true,
    };
    for field in fields.iter_mut() {
        let roles = scan.strip_roles(field, cx);
        scan.assign(field, roles, cx);
    }
    scan.report_missing(ident, cx);
    scan.into_roles()
}

/// The roles found so far, field by field.
struct RoleScan {
    /// Each role's field, with its attribute for errors about it.
    found: HashMap<&'static str, (FieldRef, Attribute)>,
    /// Roles already reported on (a near miss, a conflict): not reported missing too.
    attempted: Vec<&'static str>,
    /// No mistake so far.
    ok: bool,
}

impl RoleScan {
    /// Takes the role attributes off `field` and returns them; reports near misses
    /// and roles written with arguments.
    fn strip_roles(
        &mut self,
        field: &mut syn::Field,
        cx: &mut Ctxt,
    ) -> Vec<(&'static str, Attribute)> {
        let mut roles: Vec<(&'static str, Attribute)> = Vec::new();
        let mut kept = Vec::new();
        for attr in std::mem::take(&mut field.attrs) {
            if let Some(best) = near_miss(&attr) {
                self.attempted
                    .extend(FIELD_ATTRS.iter().find(|r| **r == best));
                cx.on(attr.path(), format!("unknown field attribute `#[{}]`: did you mean `#[{best}]`? (expected one of `#[model]`, `#[optimizer]`, `#[regressor]`, `#[callback]`, `#[mixer]`)", attr_name(&attr).unwrap_or_default()));
                self.ok = false;
                continue;
            }
            let Some(role) =
                attr_name(&attr).and_then(|n| FIELD_ATTRS.iter().find(|r| **r == n).copied())
            else {
                kept.push(attr);
                continue;
            };
            if !is_bare(role, &attr, cx) {
                self.ok = false;
            }
            roles.push((role, attr));
        }
        field.attrs = kept;
        roles
    }

    /// Records the role of one field; reports a field with several roles and a role
    /// on several fields.
    fn assign(
        &mut self,
        field: &syn::Field,
        mut roles: Vec<(&'static str, Attribute)>,
        cx: &mut Ctxt,
    ) {
        if roles.len() > 1 {
            cx.on(&roles[1].1, format!("a field can have only one of `#[model]`, `#[optimizer]`, `#[regressor]`, `#[callback]`, `#[mixer]`; this one is already `#[{}]`", roles[0].0));
            self.attempted.extend(roles.iter().map(|(role, _)| *role));
            self.ok = false;
            return;
        }
        let Some((role, attr)) = roles.pop() else {
            return;
        };
        let Some(field_ident) = field.ident.clone() else {
            return;
        };
        if let Some((first, _)) = self.found.get(role) {
            cx.on(&attr, duplicate_role(role, &first.ident));
            self.ok = false;
            return;
        }
        self.found.insert(
            role,
            (
                FieldRef {
                    ident: field_ident,
                    ty: field.ty.clone(),
                },
                attr,
            ),
        );
    }

    /// Reports a missing `#[model]` or `#[optimizer]` on the struct's name.
    fn report_missing(&mut self, ident: &Ident, cx: &mut Ctxt) {
        for role in ["model", "optimizer"] {
            if !self.found.contains_key(role) && !self.attempted.contains(&role) {
                let example = if role == "model" {
                    "#[model] model: MyModel"
                } else {
                    "#[optimizer] opt: candle_nn::AdamW"
                };
                cx.at(
                    ident.span(),
                    format!(
                        "missing `#[{role}]`: mark the field that holds the {}, as in `{example}`",
                        role_noun(role)
                    ),
                );
                self.ok = false;
            }
        }
    }

    /// The roles, when every field attribute was valid.
    fn into_roles(mut self) -> Option<Roles> {
        if !self.ok {
            return None;
        }
        let (model, _) = self.found.remove("model")?;
        let (optimizer, _) = self.found.remove("optimizer")?;
        let (regressor, regressor_attr) = match self.found.remove("regressor") {
            Some((f, a)) => (Some(f), Some(a)),
            None => (None, None),
        };
        let callback = self.found.remove("callback").map(|(f, _)| f);
        let mixer = self.found.remove("mixer").map(|(f, _)| f);
        Some(Roles {
            parts: Parts {
                model,
                optimizer,
                regressor,
                callback,
                mixer,
            },
            regressor_attr,
        })
    }
}

/// Whether a role attribute is written bare, `#[role]`; reports it otherwise.
fn is_bare(role: &str, attr: &Attribute, cx: &mut Ctxt) -> bool {
    match &attr.meta {
        Meta::Path(_) => true,
        Meta::List(list) => {
            cx.at(
                list.delimiter.span().join(),
                format!("`#[{role}]` takes no arguments: write `#[{role}]`"),
            );
            false
        }
        Meta::NameValue(nv) => {
            cx.on(
                &nv.value,
                format!("`#[{role}]` takes no value: write `#[{role}]`"),
            );
            false
        }
    }
}

/// "duplicate `#[role]`", naming the field that already has the role.
fn duplicate_role(role: &str, first: &Ident) -> String {
    format!(
        "duplicate `#[{role}]`: exactly one field can be the {}; `{}` already is{}",
        role_noun(role),
        first,
        if role == "callback" {
            " (put several callbacks in one `Vec<Box<dyn adabatch::Callback>>` field)"
        } else {
            ""
        }
    )
}

fn role_noun(role: &str) -> &'static str {
    match role {
        "model" => "model",
        "optimizer" => "optimizer",
        "callback" => "callback",
        "mixer" => "mixer",
        _ => "memory model",
    }
}
