//! Progress of a session's calls, for interactive front ends.
//!
//! A call of a large package runs for minutes on the simulator (the 27-layer
//! encoder's run call: three). The session tells a [`CallProgress`] when each
//! call starts and ends, and hands it the device's cycle counter, which the
//! simulator advances as BSP steps complete ([`ipu_sim::Chip::progress`]);
//! [`TerminalProgress`] draws that as a progress bar on stderr against the
//! compiler's estimate of the call (`schedule.json`). It draws only where
//! stderr is a terminal, so Bazel actions, CI and piped runs stay quiet.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A call that starts, as told to a [`CallProgress`].
#[derive(Clone, Debug)]
pub struct CallStart<'a> {
    /// The call.
    pub call: &'a str,
    /// The device cycle from which the call's own cycles count (after its
    /// inputs' host-link cycles).
    pub start: u64,
    /// The compiler's estimate of the call's cycles, when the package has one.
    pub estimated: Option<u64>,
    /// The device cycles reached so far (the end of the latest completed
    /// BSP step), when the device keeps such a counter.
    pub reached: Option<Arc<AtomicU64>>,
}

/// Watches the calls of a session.
pub trait CallProgress: Send + Sync {
    /// A call starts.
    fn started(&self, call: CallStart<'_>);
    /// The call returned, whether or not it succeeded.
    fn finished(&self, call: &str);
}

/// A [`CallProgress`] that options can carry (cloned, and printed as its
/// presence only).
#[derive(Clone)]
pub struct ProgressHook(pub Arc<dyn CallProgress>);

impl std::fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressHook")
    }
}

/// Tells the hook that a call ended when dropped, so that every return
/// path of the call (errors included) ends its progress.
pub(crate) struct Watch {
    hook: ProgressHook,
    call: String,
}

impl Watch {
    pub(crate) fn start(hook: &ProgressHook, call: CallStart<'_>) -> Watch {
        let name = call.call.to_string();
        hook.0.started(call);
        Watch {
            hook: hook.clone(),
            call: name,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.hook.0.finished(&self.call);
    }
}

/// How often the bar reads the device's counter.
const TICK: Duration = Duration::from_millis(100);

/// One progress bar per call on stderr (indicatif).
#[derive(Default)]
pub struct TerminalProgress {
    running: Mutex<Option<Running>>,
}

struct Running {
    bar: ProgressBar,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl TerminalProgress {
    /// A hook that draws on stderr, or `None` where nothing should be
    /// drawn ([`TerminalProgress::wanted`] with this process's stderr and
    /// environment).
    pub fn for_stderr() -> Option<ProgressHook> {
        let wanted = Self::wanted(
            std::io::stderr().is_terminal(),
            std::env::var_os("CI").is_some(),
            std::env::var("TERM").ok().as_deref(),
        );
        wanted.then(|| ProgressHook(Arc::new(TerminalProgress::default())))
    }

    /// Whether to draw: only on a terminal, and not under CI (whose logs
    /// keep every redraw) or a `dumb` terminal (which cannot move the
    /// cursor back).
    pub fn wanted(stderr_is_terminal: bool, ci: bool, term: Option<&str>) -> bool {
        stderr_is_terminal && !ci && term != Some("dumb")
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        // A panic in a ticker leaves at most a stale bar behind.
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl CallProgress for TerminalProgress {
    fn started(&self, call: CallStart<'_>) {
        let CallStart {
            call,
            start,
            estimated,
            reached,
        } = call;
        let bar = match estimated {
            Some(cycles) => ProgressBar::with_draw_target(Some(cycles), ProgressDrawTarget::stderr())
                .with_style(
                    ProgressStyle::with_template(
                        "{spinner} `{msg}` [{bar:30}] {human_pos}/~{human_len} cycles {elapsed} (eta {eta})",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                ),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{spinner} `{msg}`: {human_pos} cycles {elapsed}")
                    .expect("a valid template"),
            ),
        };
        bar.set_message(call.to_string());
        bar.enable_steady_tick(TICK);
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = reached.map(|reached| {
            let (bar, stop) = (bar.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let at = reached.load(Ordering::Relaxed).saturating_sub(start);
                    // The estimate may be short: the bar then grows.
                    if bar.length().is_some_and(|len| at > len) {
                        bar.set_length(at);
                    }
                    bar.set_position(at);
                    std::thread::sleep(TICK);
                }
            })
        });
        if let Some(old) = self.running().replace(Running { bar, stop, ticker }) {
            old.end();
        }
    }

    fn finished(&self, _call: &str) {
        if let Some(r) = self.running().take() {
            r.end();
        }
    }
}

impl Running {
    fn end(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        // The session's log line reports the call's cycles; the bar goes.
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_only_on_a_terminal_outside_ci() {
        assert!(TerminalProgress::wanted(
            true,
            false,
            Some("xterm-256color")
        ));
        assert!(TerminalProgress::wanted(true, false, None));
        assert!(!TerminalProgress::wanted(false, false, Some("xterm")));
        assert!(!TerminalProgress::wanted(true, true, Some("xterm")));
        assert!(!TerminalProgress::wanted(true, false, Some("dumb")));
    }

    #[test]
    fn a_bar_follows_the_counter_and_ends_with_its_call() {
        // Hidden draw target: the same bar logic, nothing written.
        let p = TerminalProgress::default();
        let reached = Arc::new(AtomicU64::new(1_000));
        p.started(CallStart {
            call: "run",
            start: 1_000,
            estimated: Some(500),
            reached: Some(Arc::clone(&reached)),
        });
        reached.store(1_800, Ordering::Relaxed);
        let bar = p.running().as_ref().unwrap().bar.clone();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while bar.position() != 800 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(bar.position(), 800);
        // Past the estimate, the bar grows rather than overflow.
        assert_eq!(bar.length(), Some(800));
        p.finished("run");
        assert!(p.running().is_none());
        assert!(bar.is_finished());
    }
}
