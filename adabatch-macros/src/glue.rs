//! The inherent items of a trainer: `POLICY`, `new`, `train`, `launch`.
//!
//! Each is written once, for two uses: the real glue, which calls the runtime, and
//! the stand-ins of the fallback expansion (an attribute with mistakes), which have
//! the same names, parameters and return types, looser bounds and bodies that never
//! run, so that the user's calls type-check and only the mistakes are reported.
//! A change of a signature here is a change of both.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Fields, Generics, Ident, ItemStruct, Type, WhereClause};

use crate::respan::{at, first_span, respan};

/// Which of the two the items are.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// The glue: calls the runtime. Its bounds name the model's batch type, through
    /// a method parameter `M` (`Self: AdaptiveTrainer<Model = M>`) so that a model
    /// that is not a `TrainModel` is reported once, at `type Model`, and not again
    /// by the well-formedness check of these signatures.
    Real {
        /// The `#[model]` field's type: the glue's own errors point there.
        model_ty: &'a Type,
    },
    /// The stand-ins of the fallback expansion.
    Stub,
}

/// `impl Struct { POLICY, new, train, launch, launch_with_eval, evaluate }`;
/// `policy` is the value of `POLICY`.
pub fn inherent(
    p: &TokenStream,
    item: &ItemStruct,
    policy: &TokenStream,
    mode: Mode,
) -> TokenStream {
    let ident = &item.ident;
    let (impl_generics, ty_generics, where_clause) = item.generics.split_for_impl();
    let [d, c, f, m] = ["D", "C", "F", "M"].map(|name| fresh(&item.generics, name));
    let methods = Methods {
        p,
        mode,
        where_clause,
        d,
        c,
        f,
        m,
    };
    let new = new_fn(item);
    let train = methods.train();
    let launch = methods.launch();
    let launch_with_eval = methods.launch_with_eval();
    let evaluate = methods.evaluate();
    let lints = lints(mode);
    quote! {
        #[automatically_derived]
        #[allow(#lints)]
        impl #impl_generics #ident #ty_generics #where_clause {
            /// The training policy fixed by `#[adaptive_trainer(...)]` (unset keys
            /// keep `TrainerPolicy::DEFAULT`).
            pub const POLICY: #p::TrainerPolicy = #policy;

            #new

            #train

            #launch

            #launch_with_eval

            #evaluate
        }
    }
}

/// The lints the inherent impl allows: its items may go unused, and the stand-ins'
/// parameters always do.
fn lints(mode: Mode) -> TokenStream {
    match mode {
        Mode::Real { .. } => quote!(dead_code, private_interfaces, clippy::too_many_arguments),
        Mode::Stub => quote!(
            dead_code,
            private_interfaces,
            unused_variables,
            clippy::too_many_arguments
        ),
    }
}

/// What `train`, `launch`, `launch_with_eval` and `evaluate` are written from.
struct Methods<'a> {
    /// The path of the runtime's private module.
    p: &'a TokenStream,
    /// Glue or stand-ins.
    mode: Mode<'a>,
    /// The struct's own where-clause.
    where_clause: Option<&'a WhereClause>,
    /// The dataset's generic (each named apart from the struct's own generics).
    d: Ident,
    /// The collate's generic.
    c: Ident,
    /// The factory's generic.
    f: Ident,
    /// The model's generic, in the glue.
    m: Ident,
}

impl Methods<'_> {
    fn real(&self) -> bool {
        matches!(self.mode, Mode::Real { .. })
    }

    /// In the glue, every token but the user's own where-clause reports at the
    /// model's type.
    fn glue(&self, tokens: TokenStream) -> TokenStream {
        match self.mode {
            Mode::Real { model_ty } => respan(tokens, at(first_span(model_ty))),
            Mode::Stub => tokens,
        }
    }

    /// `where` with the struct's own predicates, then `bounds`.
    fn with_where(&self, bounds: TokenStream) -> TokenStream {
        match self.where_clause {
            Some(w) if !w.predicates.is_empty() => {
                let preds = &w.predicates;
                let comma = (!preds.trailing_punct()).then(|| quote!(,));
                quote!(where #preds #comma #bounds)
            }
            _ => quote!(where #bounds),
        }
    }

    /// `, M` in the glue's generics.
    fn model_generic(&self) -> Option<TokenStream> {
        let m = &self.m;
        self.real().then(|| quote!(, #m))
    }

    /// The bounds that tie the collate's batches to the model, in the glue. The
    /// collate is bound through `M` rather than `CollateFor<Self, D>`: at a call with
    /// a model that is not a `TrainModel`, `CollateFor` fails too (two errors per
    /// call instead of one).
    fn model_bounds(&self) -> Option<TokenStream> {
        let Methods { p, d, c, m, .. } = self;
        self.real().then(|| {
            quote! {
                Self: #p::AdaptiveTrainer<Model = #m>,
                #m: #p::TrainModel,
                #d: #p::Dataset + ?::core::marker::Sized,
                #c: #p::Collate<<#d as #p::Dataset>::Item, Batch = <#m as #p::TrainModel>::Batch>,
            }
        })
    }

    /// The stand-ins' only bound: a dataset may be unsized.
    fn stub_bounds(&self) -> Option<TokenStream> {
        let d = &self.d;
        (!self.real()).then(|| quote!(#d: ?::core::marker::Sized,))
    }

    /// The body: `call` in the glue, a body that never runs in a stand-in.
    fn body(&self, call: TokenStream) -> TokenStream {
        match self.mode {
            Mode::Real { .. } => quote!({ #call }),
            Mode::Stub => quote!({ ::core::unimplemented!() }),
        }
    }

    fn train(&self) -> TokenStream {
        let Methods { p, d, c, .. } = self;
        let model_generic = self.model_generic();
        let sig = self.glue(quote! {
            /// Trains this trainer on one rank (`args.launch.nproc_per_node` must be 1;
            /// use `launch` for several ranks); it keeps its trained weights.
            pub fn train<#d, #c #model_generic>(
                &mut self,
                dataset: &#d,
                collate: &#c,
                args: &#p::TrainingArgs,
            ) -> #p::Result<#p::TrainSummary>
        });
        let where_ = self.one_rank_where();
        let body = self.glue(self.body(quote!(#p::Run::new(dataset, collate, args).train(self))));
        quote!(#sig #where_ #body)
    }

    fn evaluate(&self) -> TokenStream {
        let Methods { p, d, c, .. } = self;
        let model_generic = self.model_generic();
        let sig = self.glue(quote! {
            /// Evaluates this trainer's model on `eval_dataset` without training (HF's
            /// `trainer.evaluate()`): one evaluation on one rank, as a run's are.
            pub fn evaluate<#d, #c #model_generic>(
                &mut self,
                eval_dataset: &#d,
                collate: &#c,
                args: &#p::TrainingArgs,
            ) -> #p::Result<#p::EvalLog>
        });
        let where_ = self.one_rank_where();
        let body = self.glue(self.body(quote!(#p::Run::new(eval_dataset, collate, args)
            .with_eval(eval_dataset)
            .evaluate(self))));
        quote!(#sig #where_ #body)
    }

    /// The where-clause of `train` and `evaluate`.
    fn one_rank_where(&self) -> TokenStream {
        let model_bounds = self.model_bounds();
        let stub_bounds = self.stub_bounds();
        self.with_where(self.glue(quote!(#model_bounds #stub_bounds)))
    }

    /// The where-clause of `launch` and `launch_with_eval`.
    fn launch_where(&self) -> TokenStream {
        let Methods { p, f, .. } = self;
        let send = self.real().then(|| quote!(Self: ::core::marker::Send,));
        let model_bounds = self.model_bounds();
        let stub_bounds = self.stub_bounds();
        self.with_where(self.glue(quote! {
            #send
            #model_bounds
            #stub_bounds
            #f: ::core::ops::Fn(&#p::RankContext) -> #p::Result<Self> + ::core::marker::Sync,
        }))
    }

    fn launch(&self) -> TokenStream {
        let Methods { p, d, c, f, .. } = self;
        let model_generic = self.model_generic();
        let sig = self.glue(quote! {
            /// Trains on `args.launch.nproc_per_node` ranks, building each rank's trainer
            /// with `factory`; returns rank 0's trained trainer and the summary.
            pub fn launch<#d, #c, #f #model_generic>(
                dataset: &#d,
                collate: &#c,
                args: &#p::TrainingArgs,
                factory: #f,
            ) -> #p::Result<#p::Trained<Self>>
        });
        let where_ = self.launch_where();
        let body = self.glue(
            self.body(quote!(#p::Run::new(dataset, collate, args).launch::<Self, #f>(factory))),
        );
        quote!(#sig #where_ #body)
    }

    fn launch_with_eval(&self) -> TokenStream {
        let Methods { p, d, c, f, .. } = self;
        let model_generic = self.model_generic();
        let sig = self.glue(quote! {
            /// `launch` with an eval dataset: evaluated every `--eval-steps` steps and
            /// at the end; the evaluations are in the summary and the logs.
            pub fn launch_with_eval<#d, #c, #f #model_generic>(
                dataset: &#d,
                eval_dataset: &#d,
                collate: &#c,
                args: &#p::TrainingArgs,
                factory: #f,
            ) -> #p::Result<#p::Trained<Self>>
        });
        let where_ = self.launch_where();
        let body = self.glue(self.body(quote!(#p::Run::new(dataset, collate, args)
            .with_eval(eval_dataset)
            .launch::<Self, #f>(factory))));
        quote!(#sig #where_ #body)
    }
}

/// `new`: one parameter per field, in declaration order.
fn new_fn(item: &ItemStruct) -> TokenStream {
    let tys = item.fields.iter().map(|f| &f.ty);
    match &item.fields {
        Fields::Named(_) => {
            let names: Vec<&Ident> = item
                .fields
                .iter()
                .filter_map(|f| f.ident.as_ref())
                .collect();
            quote! {
                /// Builds the trainer from its fields, in declaration order.
                pub fn new(#(#names: #tys),*) -> Self {
                    Self { #(#names),* }
                }
            }
        }
        Fields::Unnamed(_) => {
            let names: Vec<Ident> = (0..item.fields.len())
                .map(|i| Ident::new(&format!("_{i}"), Span::call_site()))
                .collect();
            quote! {
                /// Builds the trainer from its fields, in declaration order.
                pub fn new(#(#names: #tys),*) -> Self {
                    Self(#(#names),*)
                }
            }
        }
        Fields::Unit => quote! {
            /// Builds the trainer.
            pub fn new() -> Self {
                Self
            }
        },
    }
}

/// A method generic named `name` that cannot clash with the struct's own.
fn fresh(generics: &Generics, name: &str) -> Ident {
    let taken: Vec<String> = generics
        .type_params()
        .map(|t| t.ident.to_string())
        .collect();
    let mut candidate = name.to_string();
    while taken.contains(&candidate) {
        candidate = format!("__{candidate}");
    }
    Ident::new(&candidate, Span::call_site())
}
