//! A task that wakes itself while it runs is polled again at once, not
//! rescheduled through the runtime.
//!
//! Owns: [`InlineWake`], the wrapper the front door's connection task runs
//! in. Hyper serves a request and its body in one task: the dispatcher
//! hands the body to the handler through a channel whose sender and
//! receiver are both polled by that task, so every request wakes the task
//! from inside its own poll. Tokio treats a task woken while it runs as a
//! yield: it goes to the back of the run queue *and another worker is
//! woken to steal it*. With one publisher on a kept-alive connection that
//! is a cross-thread wake-up (and a worker that takes over the I/O driver)
//! per request, which the profile of `bench fanout --subs 100 --channels
//! 100 --rate 100` showed as most of the publish path's cost.
//!
//! Invariants: no wake is lost — a wake that arrives while the inner future
//! is being polled (from this thread or another) makes this poll poll it
//! again; one that arrives between polls wakes the task. A poll re-polls at
//! most [`REPOLLS`] times, then yields to the runtime like any busy task, so
//! a future that always wakes itself cannot hold a worker.

use futures_util::task::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Polls in a row one poll of the task may make before it yields.
pub(super) const REPOLLS: usize = 8;

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const POLLING_WOKEN: u8 = 2;

/// What the inner future's waker reaches.
struct Signal {
    state: AtomicU8,
    /// The task's own waker, as of its latest poll.
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            match s {
                // The poll under way will see it and poll again.
                POLLING_WOKEN => return,
                POLLING => match self.state.compare_exchange_weak(
                    POLLING,
                    POLLING_WOKEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return,
                    Err(now) => s = now,
                },
                _ => {
                    self.task.wake();
                    return;
                }
            }
        }
    }
}

/// `F`, polled again within the same poll when it woke itself meanwhile.
pub(super) struct InlineWake<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
}

impl<F: Future> InlineWake<F> {
    pub(super) fn new(inner: F) -> InlineWake<F> {
        let signal = Arc::new(Signal {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        InlineWake {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

impl<F: Future> Future for InlineWake<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.signal.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..REPOLLS {
            this.signal.state.store(POLLING, Ordering::Release);
            if let Poll::Ready(out) = this.inner.as_mut().poll(&mut inner_cx) {
                this.signal.state.store(IDLE, Ordering::Release);
                return Poll::Ready(out);
            }
            // Woken during the poll: the state says so, and the CAS fails.
            if this
                .signal
                .state
                .compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Poll::Pending;
            }
        }
        // Still waking itself: let the worker run others, and come back.
        this.signal.state.store(IDLE, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    /// Counts the wakes the task itself receives.
    struct Counter(AtomicUsize);
    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task_waker() -> (Arc<Counter>, Waker) {
        let c = Arc::new(Counter(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    /// Wakes itself during each of its first `n` polls (as hyper's body
    /// channel does), then is ready.
    struct SelfWaking {
        polls: usize,
        n: usize,
    }
    impl Future for SelfWaking {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.n {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_wake_during_the_poll_is_a_second_poll_not_a_wake_of_the_task() {
        let (woken, waker) = task_waker();
        let mut cx = Context::from_waker(&waker);
        let mut f = InlineWake::new(SelfWaking { polls: 0, n: 3 });
        assert_eq!(Pin::new(&mut f).poll(&mut cx), Poll::Ready(4));
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        // Unwrapped, the same future goes back to the runtime once per
        // self-wake: what made tokio wake a second worker per request.
        let mut bare = Box::pin(SelfWaking { polls: 0, n: 3 });
        for _ in 0..3 {
            assert!(bare.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(woken.0.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_after_the_bound() {
        let (woken, waker) = task_waker();
        let mut cx = Context::from_waker(&waker);
        let mut f = InlineWake::new(SelfWaking {
            polls: 0,
            n: usize::MAX,
        });
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(f.inner.polls, REPOLLS);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "yielded once");
    }

    /// Pending until `go`; registers its waker each poll.
    struct Gate {
        go: Arc<AtomicBool>,
        waker: Arc<parking_lot::Mutex<Option<Waker>>>,
    }
    impl Future for Gate {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            *self.waker.lock() = Some(cx.waker().clone());
            if self.go.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    #[test]
    fn a_wake_between_polls_wakes_the_task() {
        let (woken, waker) = task_waker();
        let mut cx = Context::from_waker(&waker);
        let go = Arc::new(AtomicBool::new(false));
        let inner_waker = Arc::new(parking_lot::Mutex::new(None));
        let mut f = InlineWake::new(Gate {
            go: go.clone(),
            waker: inner_waker.clone(),
        });
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        go.store(true, Ordering::SeqCst);
        inner_waker.lock().take().expect("registered").wake();
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(Pin::new(&mut f).poll(&mut cx).is_ready());
    }

    /// Wakes from another thread racing the end of each poll: every wake
    /// either makes the poll under way poll again or wakes the task, so the
    /// future always finishes (a lost wake would leave it pending forever).
    #[test]
    fn no_wake_from_another_thread_is_lost() {
        for round in 0..2_000 {
            let go = Arc::new(AtomicBool::new(false));
            let inner_waker: Arc<parking_lot::Mutex<Option<Waker>>> =
                Arc::new(parking_lot::Mutex::new(None));
            let (woken, waker) = task_waker();
            let mut f = InlineWake::new(Gate {
                go: go.clone(),
                waker: inner_waker.clone(),
            });
            let mut cx = Context::from_waker(&waker);
            assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
            let w = inner_waker.lock().clone().expect("registered");
            let t = std::thread::spawn(move || {
                for _ in 0..(round % 7) {
                    std::hint::spin_loop();
                }
                go.store(true, Ordering::SeqCst);
                w.wake();
            });
            // The task polls until it is done, but only when woken (or on
            // the first poll after the thread started).
            let mut seen = 0;
            let mut done = Pin::new(&mut f).poll(&mut cx).is_ready();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !done {
                let now = woken.0.load(Ordering::SeqCst);
                if now > seen {
                    seen = now;
                    done = Pin::new(&mut f).poll(&mut cx).is_ready();
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: a wake was lost"
                );
            }
            t.join().expect("waker thread");
        }
    }
}
