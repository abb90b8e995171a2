//! What the library says beside the log lines a user asked for (the step records,
//! the plan of a dry run): warnings and notes. A program with a `tracing`
//! subscriber gets them as events of target `adabatch` (a warning at `WARN`, its
//! text without the `warning: ` prefix; a note at `INFO`), to filter, capture or
//! format as it likes; without one they print on standard error as they read
//! (`warning: …`), so that nothing is lost for a program that never heard of
//! `tracing`.

/// A warning: something the run did instead of what was asked, or a result that
/// may surprise.
pub fn warning(text: &str) {
    if subscribed() {
        tracing::warn!(target: "adabatch", "{text}");
    } else {
        eprintln!("warning: {text}");
    }
}

/// A note: what the run did, for the record (a checkpoint saved, an OOM handled).
pub fn note(text: &str) {
    if subscribed() {
        tracing::info!(target: "adabatch", "{text}");
    } else {
        eprintln!("{text}");
    }
}

/// A message as the engine words it: a warning when it starts `warning: `.
pub(crate) fn say(message: &str) {
    match message.strip_prefix("warning: ") {
        Some(text) => warning(text),
        None => note(message),
    }
}

/// Whether a subscriber is in force here (a global one, or one set for this
/// thread or scope).
fn subscribed() -> bool {
    tracing::dispatcher::get_default(|d| !d.is::<tracing::subscriber::NoSubscriber>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    /// Keeps each event's level, target and message.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<(tracing::Level, String, String)>>>);

    struct Message(String);

    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut message = Message(String::new());
            event.record(&mut message);
            let meta = event.metadata();
            let entry = (*meta.level(), meta.target().to_string(), message.0);
            self.0.lock().unwrap().push(entry);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn a_program_with_a_subscriber_captures_warnings_and_notes() {
        let capture = Capture::default();
        tracing::subscriber::with_default(capture.clone(), || {
            say("warning: the plot could not be drawn");
            say("saved the model to out");
            warning("direct");
        });
        let seen = capture.0.lock().unwrap().clone();
        let adabatch = |level, text: &str| (level, "adabatch".to_string(), text.to_string());
        assert_eq!(
            seen,
            [
                adabatch(tracing::Level::WARN, "the plot could not be drawn"),
                adabatch(tracing::Level::INFO, "saved the model to out"),
                adabatch(tracing::Level::WARN, "direct"),
            ]
        );
        assert!(!subscribed(), "outside the scope nothing is subscribed");
    }
}
