//! Rules that span several keys, or a key and the struct. Each runs only when the
//! keys it relates are themselves valid, so one mistake is reported once.

use crate::attr::{Attrs, Schedule, Written};
use crate::ctxt::Ctxt;
use crate::item::Roles;

/// Every rule across keys.
pub fn check(attrs: &Attrs, roles: Option<&Roles>, cx: &mut Ctxt) {
    batch_bounds(attrs, cx);
    if let Some(roles) = roles {
        regressor_needs_memory(attrs, roles, cx);
    }
}

/// `min_batch <= max_batch`, reported on `max_batch`'s value.
fn batch_bounds(attrs: &Attrs, cx: &mut Ctxt) {
    if let (Some((min, _)), Some((max, max_value))) = (attrs.min_batch, attrs.max_batch) {
        if min > max {
            cx.on(
                max_value,
                format!("`max_batch = {max}` is smaller than `min_batch = {min}`"),
            );
        }
    }
}

/// A `#[regressor]` only drives `schedule = memory(..)`.
fn regressor_needs_memory(attrs: &Attrs, roles: &Roles, cx: &mut Ctxt) {
    let Some(regressor) = &roles.regressor_attr else {
        return;
    };
    let memory = match &attrs.schedule {
        Written::Valid(schedule) => matches!(schedule, Schedule::Memory { .. }),
        Written::Absent => false,
        // Already reported; it may have meant `memory`.
        Written::Invalid => true,
    };
    if !memory {
        cx.on(
            regressor,
            "`#[regressor]` needs `schedule = memory(..)`: the memory model only drives the memory schedule; add `schedule = memory(threshold = 0.9, max_range = 2.0)` or remove the field attribute",
        );
    }
}
