//! Tokens from a [`TrainerSpec`]: the struct, the `AdaptiveTrainer` impl, the
//! inherent items (`glue`), and the compile-time checks of the policy.
//! Everything but the struct lives inside one `const _: () = { ... };`.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::{Ident, ItemStruct};

use crate::glue::{self, Mode};
use crate::respan::{at, first_span};
use crate::spec::{
    Every, GradAccum, Growth, LrScaling, Mix, Oom, Parts, PolicyValue, Reweight, Schedule,
    TrainerSpec, Warmup,
};

/// The whole expansion.
pub fn expand(spec: &TrainerSpec) -> TokenStream {
    let krate = &spec.krate;
    let p = quote!(#krate::__private);
    let item = &spec.item;

    let schedule_fn_item = schedule_fn_item(&p, spec);
    let mix_fn_item = mix_fn_item(&p, spec);

    let fields: Vec<(Ident, TokenStream)> = spec
        .policy
        .iter()
        .map(|k| policy_field(&p, &k.value))
        .collect();
    let policy_expr = policy_literal(&p, fields.iter().map(|(f, e)| (f, e)));
    let per_key = per_key_checks(&p, spec, &fields);
    let whole_check = whole_policy_check(&p, &fields);

    let policy_const = format_ident!("__ADABATCH_POLICY");
    let trainer_impl = trainer_impl(&p, item, &spec.parts, &quote!(#policy_const));
    let inherent = glue::inherent(
        &p,
        item,
        &quote!(#policy_const),
        Mode::Real {
            model_ty: &spec.parts.model.ty,
        },
    );

    // `..DEFAULT` is written even when every key is given, so that a field added to
    // `TrainerPolicy` does not break generated code.
    quote! {
        #item

        #[allow(clippy::needless_update)]
        const _: () = {
            #schedule_fn_item
            #mix_fn_item

            const #policy_const: #p::TrainerPolicy = #policy_expr;

            #trainer_impl

            #inherent

            #(#per_key)*
            #whole_check
        };
    }
}

/// A `custom(path)` schedule goes through a typed const spanned on the path, so a
/// function of the wrong signature is reported there, once.
fn schedule_fn_item(p: &TokenStream, spec: &TrainerSpec) -> Option<TokenStream> {
    let schedule_fn = spec.policy.iter().find_map(|k| match &k.value {
        PolicyValue::Schedule(Schedule::Custom(path)) => Some(path),
        _ => None,
    });
    let step_time_fn = spec.policy.iter().find_map(|k| match &k.value {
        PolicyValue::Schedule(Schedule::Goodput {
            step_time: Some(path),
            ..
        }) => Some(path),
        _ => None,
    });
    if let Some(path) = step_time_fn {
        let span = at(first_span(path));
        return Some(quote_spanned! {span=>
            const __ADABATCH_STEP_TIME_FN: #p::StepTimeFn = #path;
        });
    }
    schedule_fn.map(|path| {
        let span = at(first_span(path));
        quote_spanned! {span=>
            const __ADABATCH_SCHEDULE_FN: #p::ScheduleFn = #path;
        }
    })
}

/// `mix = custom(path)` likewise.
fn mix_fn_item(p: &TokenStream, spec: &TrainerSpec) -> Option<TokenStream> {
    spec.policy.iter().find_map(|k| match &k.value {
        PolicyValue::Mix(Mix::Custom(path)) => {
            let span = at(first_span(path));
            Some(quote_spanned! {span=>
                const __ADABATCH_MIX_FN: #p::MixFn = #path;
            })
        }
        _ => None,
    })
}

/// One check per key, spanned on its value: the runtime says which policies it
/// cannot run yet (`TrainerPolicy::assert_supported`), the error lands on the key.
fn per_key_checks(
    p: &TokenStream,
    spec: &TrainerSpec,
    fields: &[(Ident, TokenStream)],
) -> Vec<TokenStream> {
    spec.policy
        .iter()
        .zip(fields)
        .map(|(key, (field, expr))| {
            let alone = policy_literal(p, std::iter::once((field, expr)));
            quote_spanned! {at(key.span)=>
                const _: () = (#alone).assert_supported();
            }
        })
        .collect()
}

/// Then the whole policy (combinations), unless a single key already failed.
fn whole_policy_check(p: &TokenStream, fields: &[(Ident, TokenStream)]) -> TokenStream {
    let singles_ok: Vec<TokenStream> = fields
        .iter()
        .map(|(field, expr)| {
            let alone = policy_literal(p, std::iter::once((field, expr)));
            quote!((#alone).unsupported().is_none())
        })
        .collect();
    // A combination has no single culprit: the error is on the attribute.
    if singles_ok.is_empty() {
        quote! {
            const _: () = __ADABATCH_POLICY.assert_supported();
        }
    } else {
        quote! {
            const _: () = if #(#singles_ok)&&* {
                __ADABATCH_POLICY.assert_supported()
            };
        }
    }
}

/// `impl AdaptiveTrainer for Struct`, with `policy` as its `POLICY`.
pub fn trainer_impl(
    p: &TokenStream,
    item: &ItemStruct,
    parts: &Parts,
    policy: &TokenStream,
) -> TokenStream {
    let ident = &item.ident;
    let (impl_generics, ty_generics, where_clause) = item.generics.split_for_impl();
    let (model_ident, model_ty) = (&parts.model.ident, &parts.model.ty);
    let (opt_ident, opt_ty) = (&parts.optimizer.ident, &parts.optimizer.ty);
    let regressor_fn = parts.regressor.as_ref().map(|r| {
        let (r_ident, r_ty) = (&r.ident, &r.ty);
        let cast = quote_spanned! {at(first_span(r_ty))=> regressor};
        quote! {
            fn regressor(&mut self) -> ::core::option::Option<&mut dyn #p::MemoryModel> {
                let regressor: &mut #r_ty = &mut self.#r_ident;
                ::core::option::Option::Some(#cast)
            }
        }
    });
    let callback_fn = parts.callback.as_ref().map(|c| {
        let (c_ident, c_ty) = (&c.ident, &c.ty);
        let cast = quote_spanned! {at(first_span(c_ty))=> callback};
        quote! {
            fn callback(&mut self) -> ::core::option::Option<&mut dyn #p::Callback> {
                let callback: &mut #c_ty = &mut self.#c_ident;
                ::core::option::Option::Some(#cast)
            }
        }
    });
    let mixer_fn = parts.mixer.as_ref().map(|m| {
        let (m_ident, m_ty) = (&m.ident, &m.ty);
        let cast = quote_spanned! {at(first_span(m_ty))=> mixer};
        quote! {
            fn mixer(&mut self) -> ::core::option::Option<&mut dyn #p::Mixer> {
                let mixer: &mut #m_ty = &mut self.#m_ident;
                ::core::option::Option::Some(#cast)
            }
        }
    });
    quote! {
        #[automatically_derived]
        impl #impl_generics #p::AdaptiveTrainer for #ident #ty_generics #where_clause {
            type Model = #model_ty;
            type Optimizer = #opt_ty;
            const POLICY: #p::TrainerPolicy = #policy;
            fn parts(&mut self) -> (&mut Self::Model, &mut Self::Optimizer) {
                (&mut self.#model_ident, &mut self.#opt_ident)
            }
            #regressor_fn
            #callback_fn
            #mixer_fn
        }
    }
}

/// `TrainerPolicy { field: value, .., ..DEFAULT }`: the fields not given keep
/// their default, however many fields `TrainerPolicy` has.
fn policy_literal<'a>(
    p: &TokenStream,
    fields: impl Iterator<Item = (&'a Ident, &'a TokenStream)>,
) -> TokenStream {
    let (names, exprs): (Vec<_>, Vec<_>) = fields.unzip();
    quote!(#p::TrainerPolicy { #(#names: #exprs,)* ..#p::TrainerPolicy::DEFAULT })
}

fn some(value: TokenStream) -> TokenStream {
    quote!(::core::option::Option::Some(#value))
}

fn int(n: usize) -> Literal {
    Literal::usize_unsuffixed(n)
}

/// The `TrainerPolicy` field a key sets, and its value expression.
fn policy_field(p: &TokenStream, value: &PolicyValue) -> (Ident, TokenStream) {
    let name = |s: &str| Ident::new(s, Span::call_site());
    match value {
        PolicyValue::Schedule(s) => (name("schedule"), schedule(p, s)),
        PolicyValue::MinBatch(n) => (name("min_batch"), int(*n).into_token_stream()),
        PolicyValue::MaxBatch(n) => (name("max_batch"), some(int(*n).into_token_stream())),
        PolicyValue::DropLast(b) => (name("drop_last"), quote!(#b)),
        PolicyValue::Shuffle(b) => (name("shuffle"), quote!(#b)),
        PolicyValue::Seed(n) => {
            let lit = Literal::u64_unsuffixed(*n);
            (name("seed"), quote!(#lit))
        }
        PolicyValue::Reweight(r) => {
            let v = match r {
                Reweight::SampleCount => quote!(SampleCount),
                Reweight::TokenCount => quote!(TokenCount),
                Reweight::RankMean => quote!(RankMean),
            };
            (name("reweight"), quote!(#p::Reweight::#v))
        }
        PolicyValue::Oom(o) => {
            let v = match o {
                Oom::Fail => quote!(Fail),
                Oom::Halve => quote!(Halve),
                Oom::SplitRetry => quote!(SplitRetry),
                Oom::Skip => quote!(Skip),
            };
            (name("oom"), quote!(#p::OomPolicy::#v))
        }
        PolicyValue::GradAccum(g) => {
            let v = match g {
                GradAccum::Fixed(n) => {
                    let n = int(*n);
                    quote!(Fixed(#n))
                }
                GradAccum::Target(n) => {
                    let n = int(*n);
                    quote!(Target { global: #n })
                }
            };
            (name("grad_accum"), quote!(#p::GradAccum::#v))
        }
        PolicyValue::Mix(m) => (name("mix"), mix_spec(p, m)),
        PolicyValue::LrScaling(l) => {
            let v = match l {
                LrScaling::Off => quote!(Off),
                LrScaling::Linear => quote!(Linear),
                LrScaling::Sqrt => quote!(Sqrt),
                LrScaling::AdamScale => quote!(AdamScale),
            };
            (name("lr_scaling"), quote!(#p::LrScaling::#v))
        }
    }
}

/// `mix = ..` as the `MixSpec` it asks for.
fn mix_spec(p: &TokenStream, mix: &Mix) -> TokenStream {
    match mix {
        Mix::Fixed(weights) => {
            let pairs = weights.iter().map(|(name, w)| {
                let w = Literal::f64_unsuffixed(*w);
                quote!((#name, #w))
            });
            quote!(#p::MixSpec::Fixed(&[#(#pairs),*]))
        }
        Mix::Online {
            temperature,
            floor,
            smoothing,
            warmup,
        } => {
            let (t, f, s) = (
                Literal::f64_unsuffixed(*temperature),
                Literal::f64_unsuffixed(*floor),
                Literal::f64_unsuffixed(*smoothing),
            );
            let w = match *warmup {
                Warmup::Steps(n) => {
                    let n = Literal::usize_unsuffixed(n);
                    quote!(#p::MixWarmup::Steps(#n))
                }
                Warmup::Fraction(x) => {
                    let x = Literal::f64_unsuffixed(x);
                    quote!(#p::MixWarmup::Fraction(#x))
                }
            };
            quote!(#p::MixSpec::Online { temperature: #t, floor: #f, smoothing: #s, warmup: #w })
        }
        Mix::Pike { t0, numbers, tau } => {
            let t0 = Literal::usize_unsuffixed(*t0);
            let [z1, z2, f, s] = numbers.map(Literal::f64_unsuffixed);
            let tau = match tau {
                Some(x) => {
                    let x = Literal::f64_unsuffixed(*x);
                    quote!(::core::option::Option::Some(#x))
                }
                None => quote!(::core::option::Option::None),
            };
            quote!(#p::MixSpec::Pike { t0: #t0, zeta1: #z1, zeta2: #z2, floor: #f, smoothing: #s, tau: #tau })
        }
        Mix::Custom(_) => quote!(#p::MixSpec::Custom(__ADABATCH_MIX_FN)),
    }
}

fn schedule(p: &TokenStream, s: &Schedule) -> TokenStream {
    let spec = quote!(#p::ScheduleSpec);
    match s {
        Schedule::Constant(None) => quote!(#spec::Constant(::core::option::Option::None)),
        Schedule::Constant(Some(n)) => {
            let n = some(int(*n).into_token_stream());
            quote!(#spec::Constant(#n))
        }
        Schedule::Interval { every, growth } => {
            let every = int(*every);
            let growth = match growth {
                Growth::Add(k) if *k < 0 => {
                    let k = Literal::u64_unsuffixed(k.unsigned_abs());
                    quote!(#p::Growth::Add(-#k))
                }
                Growth::Add(k) => {
                    let k = Literal::i64_unsuffixed(*k);
                    quote!(#p::Growth::Add(#k))
                }
                Growth::Mul(k) => {
                    let k = int(*k);
                    quote!(#p::Growth::Mul(#k))
                }
            };
            quote!(#spec::Interval { every: #every, growth: #growth })
        }
        Schedule::Linear { from, to, over } => {
            let (from, to, over) = (int(*from), int(*to), int(*over));
            quote!(#spec::Linear { from: #from, to: #to, over: #over })
        }
        Schedule::Steps(table) => {
            let pairs = table.iter().map(|(t, s)| {
                let (t, s) = (int(*t), int(*s));
                quote!((#t, #s))
            });
            quote!(#spec::Steps(&[#(#pairs),*]))
        }
        Schedule::Custom(_) => quote!(#spec::Custom(__ADABATCH_SCHEDULE_FN)),
        Schedule::NoiseScale { .. } | Schedule::Goodput { .. } => feedback_schedule(p, s),
        Schedule::Ramp {
            start,
            increment,
            samples,
            global,
            in_tokens,
        } => {
            let (a, b, c, g) = (int(*start), int(*increment), int(*samples), int(*global));
            let variant = if *in_tokens {
                quote!(TokenRamp)
            } else {
                quote!(Ramp)
            };
            quote!(#spec::#variant(#p::Ramp { start: #a, increment: #b, samples: #c, global: #g }))
        }
        Schedule::Memory {
            threshold,
            max_range,
        } => {
            let (t, r) = (
                Literal::f64_unsuffixed(*threshold),
                Literal::f64_unsuffixed(*max_range),
            );
            quote!(#spec::Memory { threshold: #t, max_range: #r })
        }
    }
}

/// The schedules the engine drives from what it measures (`noise_scale`,
/// `goodput`).
fn feedback_schedule(p: &TokenStream, s: &Schedule) -> TokenStream {
    let spec = quote!(#p::ScheduleSpec);
    match s {
        Schedule::NoiseScale {
            fraction,
            min,
            max,
            factor,
            hysteresis,
            shrink,
            every,
        } => {
            let (f, h) = (
                Literal::f64_unsuffixed(*fraction),
                Literal::f64_unsuffixed(*hysteresis),
            );
            let (a, b, k) = (int(*min), int(*max), int(*factor));
            let every = match every {
                Every::Modeled => quote!(#p::MeasureEvery::Modeled),
                Every::Auto => quote!(#p::MeasureEvery::Auto),
                Every::Steps(n) => {
                    let n = int(*n);
                    quote!(#p::MeasureEvery::Steps(#n))
                }
            };
            quote!(#spec::NoiseScale(#p::NoiseScalePolicy {
                fraction: #f, min: #a, max: #b, factor: #k, hysteresis: #h, shrink: #shrink,
                every: #every
            }))
        }
        Schedule::Goodput {
            min,
            max,
            max_local,
            max_micro_batches,
            hysteresis,
            step_time,
        } => {
            let (a, b, m, k) = (
                int(*min),
                int(*max),
                int(*max_local),
                int(*max_micro_batches),
            );
            let h = Literal::f64_unsuffixed(*hysteresis);
            let step_time = match step_time {
                Some(_) => quote!(::core::option::Option::Some(__ADABATCH_STEP_TIME_FN)),
                None => quote!(::core::option::Option::None),
            };
            quote!(#spec::Goodput(#p::GoodputSpec {
                min: #a, max: #b, max_local: #m, max_micro_batches: #k, hysteresis: #h,
                step_time: #step_time
            }))
        }
        _ => unreachable!("only the feedback schedules"),
    }
}
