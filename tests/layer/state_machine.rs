//! A property test of the response future's state machine: arbitrary sequences of events —
//! the handler's answers (success, retryable, a `409`) and timings, a fence at any point (in
//! the handler, or from a task it spawned during the backoff or a wait), client cancels,
//! deadlines, several requests contending for the route's slot and the replay gate — on
//! tokio's paused clock. After every case:
//!
//! - no attempt starts after its request's fence, nor at or past its deadline;
//! - no request makes more than `max_attempts` attempts;
//! - every slot, gate permit and buffered byte is back (a probe that needs the slot and the
//!   gate succeeds; the buffered-bytes gauge reads 0);
//! - `requests` equals the sum of the outcomes, nothing in flight;
//! - (feature `metrics`) every queued wait is sampled once: at least one sample per wait for a
//!   slot, at most one per attempt or stopped request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use proptest::prelude::*;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::metrics::RetryOutcome;
use tower_sqlite_retry::policy::Admission;
use tower_sqlite_retry::{Attempt, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

#[derive(Clone, Copy, Debug)]
enum Answer {
    Ok,
    Busy,
    Conflict,
}

/// One attempt's script: how long the handler takes, what it answers, and whether (and when)
/// its request is fenced: `Some(0)` in the handler before it answers, `Some(ms)` from a task
/// it spawns, that many milliseconds after it answered.
#[derive(Clone, Copy, Debug)]
struct Step {
    millis: u64,
    answer: Answer,
    fence: Option<u64>,
}

#[derive(Clone, Debug)]
struct Client {
    steps: Vec<Step>,
    /// The client leaves after this long.
    cancel: Option<u64>,
}

#[derive(Clone, Debug)]
struct Case {
    max_attempts: u32,
    deadline: u64,
    base: u64,
    max: u64,
    admission: bool,
    clients: Vec<Client>,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0u64..30,
        prop_oneof![
            3 => Just(Answer::Busy),
            1 => Just(Answer::Ok),
            1 => Just(Answer::Conflict),
        ],
        prop::option::weighted(0.2, 0u64..40),
    )
        .prop_map(|(millis, answer, fence)| Step {
            millis,
            answer,
            fence,
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        1u32..8,
        10u64..400,
        0u64..10,
        1u64..60,
        any::<bool>(),
        prop::collection::vec(
            (
                prop::collection::vec(step(), 1..6),
                prop::option::weighted(0.3, 0u64..300),
            )
                .prop_map(|(steps, cancel)| Client { steps, cancel }),
            1..5,
        ),
    )
        .prop_map(
            |(max_attempts, deadline, base, extra, admission, clients)| Case {
                max_attempts,
                deadline,
                base,
                max: base + extra,
                admission,
                clients,
            },
        )
}

/// What the handler saw when an attempt started.
#[derive(Debug)]
struct Started {
    client: usize,
    attempt: u32,
    at: Instant,
    fenced: bool,
}

#[derive(Clone)]
struct Handler {
    scripts: Arc<Vec<Client>>,
    started: Arc<Mutex<Vec<Started>>>,
}

impl Handler {
    async fn handle(self, attempt: Attempt, headers: HeaderMap) -> Response {
        if headers.contains_key("probe") {
            return if attempt.is_replay() {
                StatusCode::OK.into_response()
            } else {
                busy()
            };
        }
        let client: usize = headers["client"].to_str().unwrap().parse().unwrap();
        self.started.lock().unwrap().push(Started {
            client,
            attempt: attempt.number(),
            at: Instant::now(),
            fenced: attempt.is_fenced(),
        });
        let steps = &self.scripts[client].steps;
        let step = steps[(attempt.number() as usize - 1).min(steps.len() - 1)];
        tokio::time::sleep(Duration::from_millis(step.millis)).await;
        match step.fence {
            Some(0) => attempt.fence(),
            Some(ms) => {
                let attempt = attempt.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    attempt.fence();
                });
            }
            None => {}
        }
        match step.answer {
            Answer::Ok => StatusCode::CREATED.into_response(),
            Answer::Busy => busy(),
            Answer::Conflict => StatusCode::CONFLICT.into_response(),
        }
    }
}

fn busy() -> Response {
    let mut res = StatusCode::SERVICE_UNAVAILABLE.into_response();
    res.extensions_mut()
        .insert(Retryable::new("5", "SQLITE_BUSY"));
    res
}

fn run(case: Case) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    #[cfg(feature = "metrics")]
    let debugging = metrics_util::debugging::DebuggingRecorder::new();
    #[cfg(feature = "metrics")]
    let snapshotter = debugging.snapshotter();
    #[cfg(feature = "metrics")]
    let _local = metrics::set_default_local_recorder(&debugging);
    let deadline = Duration::from_millis(case.deadline);
    let policy = RetryPolicy::default()
        .max_attempts(case.max_attempts)
        .deadline(deadline)
        .base_delay(Duration::from_millis(case.base))
        .max_delay(Duration::from_millis(case.max))
        .jitter(Jitter::Full)
        .admission(if case.admission {
            Admission::Adaptive
        } else {
            Admission::Off
        });
    let layer = SqliteRetryLayer::new(policy);
    let metrics = layer.metrics();
    let handler = Handler {
        scripts: Arc::new(case.clients.clone()),
        started: Arc::default(),
    };
    let h = handler.clone();
    let app = Router::new()
        .route(
            "/w",
            post(move |attempt: Attempt, headers: HeaderMap| h.clone().handle(attempt, headers)),
        )
        .layer(layer);
    let outcomes = rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = case
            .clients
            .iter()
            .enumerate()
            .map(|(i, client)| {
                let req = Request::post("/w")
                    .header("client", i.to_string())
                    .body(Body::from("x"))
                    .unwrap();
                let fut = app.clone().oneshot(req);
                let cancel = client.cancel;
                tokio::spawn(async move {
                    match cancel {
                        Some(ms) => tokio::time::timeout(Duration::from_millis(ms), fut)
                            .await
                            .ok()
                            .map(|r| r.unwrap()),
                        None => Some(fut.await.unwrap()),
                    }
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap().map(|res| {
                res.extensions()
                    .get::<RetryOutcome>()
                    .map_or((Outcome::FirstTry, 1), |o| (o.outcome(), o.attempts()))
            }));
        }
        // Let the fences spawned late land, then probe: the probe fails once, so it needs
        // the route's slot (if limited) and the gate; were either kept, it would wait out its
        // deadline.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let probe = Request::post("/w")
            .header("probe", "1")
            .body(Body::from("x"))
            .unwrap();
        let res = app.clone().oneshot(probe).await.unwrap();
        let probed = (
            res.status(),
            res.extensions().get::<RetryOutcome>().map(|o| o.outcome()),
        );
        (start, outcomes, probed)
    });
    let (start, outcomes, probed) = outcomes;
    // (One attempt allowed: the probe cannot replay, but still needs the slot.)
    let want = if case.max_attempts > 1 {
        (StatusCode::OK, Some(Outcome::SucceededAfterRetry))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Some(Outcome::Exhausted))
    };
    prop_assert_eq!(probed, want, "slot and gate back");
    let started = handler.started.lock().unwrap();
    let mut attempts: HashMap<usize, u32> = HashMap::new();
    for s in started.iter() {
        prop_assert!(
            !s.fenced,
            "attempt {} started after its fence: {:?}",
            s.attempt,
            s
        );
        prop_assert!(
            s.at < start + deadline,
            "attempt started at or past the deadline: {:?}",
            s
        );
        *attempts.entry(s.client).or_default() += 1;
    }
    for (client, n) in &attempts {
        prop_assert!(*n <= case.max_attempts, "client {client}: {n} attempts");
    }
    for (i, o) in outcomes.iter().enumerate() {
        if let Some((_, n)) = o {
            prop_assert_eq!(*n, attempts.get(&i).copied().unwrap_or(0), "client {}", i);
        }
    }
    let m = metrics.snapshot();
    prop_assert_eq!(m.requests, case.clients.len() as u64 + 1);
    prop_assert_eq!(m.requests, m.finished(), "{:?}", m);
    prop_assert_eq!(m.buffered_bytes, 0);
    let cancelled = outcomes.iter().filter(|o| o.is_none()).count() as u64;
    prop_assert_eq!(m.cancelled, cancelled);
    #[cfg(feature = "metrics")]
    {
        let samples: usize = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.key().name() == tower_sqlite_retry::metrics::recorder::QUEUE_WAIT
            })
            .map(|(.., value)| match value {
                metrics_util::debugging::DebugValue::Histogram(h) => h.len(),
                _ => 0,
            })
            .sum();
        let total_attempts = started.len() + 2; // the probe's two
        prop_assert!(
            samples as u64 >= m.queued,
            "{samples} samples, {} waits",
            m.queued
        );
        prop_assert!(
            samples <= total_attempts + case.clients.len(),
            "{samples} samples for {total_attempts} attempts"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn the_state_machine_keeps_its_promises(case in case()) {
        run(case)?;
    }
}

/// A busy case kept as a plain test: four clients, fences from spawned tasks, a cancel.
#[test]
fn four_clients_with_fences_and_a_cancel() {
    let busy = |fence| Step {
        millis: 5,
        answer: Answer::Busy,
        fence,
    };
    run(Case {
        max_attempts: 6,
        deadline: 200,
        base: 2,
        max: 20,
        admission: true,
        clients: vec![
            Client {
                steps: vec![busy(None), busy(Some(3)), busy(None)],
                cancel: None,
            },
            Client {
                steps: vec![busy(None)],
                cancel: Some(30),
            },
            Client {
                steps: vec![busy(Some(0))],
                cancel: None,
            },
            Client {
                steps: vec![busy(None), busy(None), busy(None)],
                cancel: None,
            },
        ],
    })
    .unwrap();
}
