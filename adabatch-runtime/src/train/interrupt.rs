//! Preemption: SIGTERM (SLURM, Kubernetes, spot instances), SIGINT (Ctrl-C) and
//! SIGUSR1 (SLURM's `--signal`) end a run with a checkpoint instead of losing the
//! work since the last one.
//!
//! The first signal is counted; every rank reads the count when it all-reduces its
//! step (the flag rides in the step's collective), so all ranks learn of it after
//! the same step, even ranks in other processes that got no signal. The run then
//! saves a checkpoint at that step and stops with [`TrainingError::Interrupted`], which
//! [`crate::exit_code`] turns into exit code [`crate::INTERRUPTED_EXIT_CODE`]. A second
//! signal while the first is being handled exits at once (code 130), as a second
//! Ctrl-C does elsewhere.
//!
//! The handlers are installed the first time a run starts in the process, and stay
//! (signal-hook's handlers chain with others; a run started later in the same
//! process is stopped only by signals that arrive after it started).
//!
//! [`TrainingError::Interrupted`]: crate::TrainingError::Interrupted

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// What the handlers record.
struct Signals {
    /// Signals received so far.
    count: Arc<AtomicUsize>,
    /// The last signal's number.
    last: Arc<AtomicI32>,
    /// A signal is being handled: another one exits at once.
    pending: Arc<AtomicBool>,
}

static SIGNALS: OnceLock<Option<Signals>> = OnceLock::new();

/// Installs the handlers (once per process); `None` where signals cannot be
/// handled (not Unix, or the registration failed).
fn signals() -> Option<&'static Signals> {
    SIGNALS.get_or_init(install).as_ref()
}

#[cfg(unix)]
fn install() -> Option<Signals> {
    use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
    let signals = Signals {
        count: Arc::new(AtomicUsize::new(0)),
        last: Arc::new(AtomicI32::new(0)),
        pending: Arc::new(AtomicBool::new(false)),
    };
    for signal in [SIGTERM, SIGINT, SIGUSR1] {
        // First: a signal while one is pending exits (signal-hook's documented
        // order, so that the first signal only sets the flag).
        signal_hook::flag::register_conditional_shutdown(signal, 130, signals.pending.clone())
            .ok()?;
        let (count, last, pending) = (
            signals.count.clone(),
            signals.last.clone(),
            signals.pending.clone(),
        );
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        unsafe {
            signal_hook::low_level::register(signal, move || {
                last.store(signal, Ordering::SeqCst);
                count.fetch_add(1, Ordering::SeqCst);
                pending.store(true, Ordering::SeqCst);
            })
        }
        .ok()?;
    }
    Some(signals)
}

#[cfg(not(unix))]
fn install() -> Option<Signals> {
    None
}

/// One run's view of the signals: those after its start stop it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Interrupts {
    baseline: usize,
}

impl Interrupts {
    /// Installs the handlers if needed and notes the signals so far.
    pub(crate) fn start() -> Self {
        Self {
            baseline: signals().map_or(0, |s| s.count.load(Ordering::SeqCst)),
        }
    }

    /// Whether a signal arrived since the run started.
    pub(crate) fn requested(&self) -> bool {
        signals().is_some_and(|s| s.count.load(Ordering::SeqCst) > self.baseline)
    }

    /// The last signal's name.
    pub(crate) fn last_signal() -> String {
        let number = signals().map_or(0, |s| s.last.load(Ordering::SeqCst));
        signal_name(number)
    }

    /// The signal is handled (the checkpoint written): a later one starts over
    /// instead of exiting at once.
    pub(crate) fn handled() {
        if let Some(s) = signals() {
            s.pending.store(false, Ordering::SeqCst);
        }
    }
}

fn signal_name(number: i32) -> String {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
        match number {
            SIGTERM => return "SIGTERM".into(),
            SIGINT => return "SIGINT".into(),
            SIGUSR1 => return "SIGUSR1".into(),
            _ => {}
        }
    }
    format!("signal {number}")
}
