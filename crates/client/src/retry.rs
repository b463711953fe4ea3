//! The one retry loop of every call the client makes to the servers that may answer it:
//! planning on each server, a call any server (or any holder of a shard) may answer, and a
//! shard's stream. [`Attempts`] ranks the holders, sorts each failure by what a retry can
//! change ([`Failure`]), rests a failing server, passes over one that cannot serve the call,
//! and backs off only when no other holder works; callers add only what is theirs (a
//! stream resumes from its first undelivered row).

use std::sync::Arc;
use std::time::Duration;

use tonic::Code;

use crate::error::{ClientError, Result, status_text};
use crate::fleet::{Fleet, Member};

/// What a failed call says about trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The server or the network (unavailable, reset, deadline, overloaded): retry, on
    /// another holder first.
    Transient,
    /// This server cannot serve it (no such file, another version of it): ask another
    /// holder, never this one again for it.
    Elsewhere,
    /// The request or the data (a bad value, corrupt data, a refused query): the same on
    /// every server and every retry.
    Final,
}

impl Failure {
    pub(crate) fn of(code: Code) -> Self {
        match code {
            Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::DeadlineExceeded
            | Code::Internal => Failure::Transient,
            Code::NotFound | Code::FailedPrecondition => Failure::Elsewhere,
            Code::Ok
            | Code::InvalidArgument
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::DataLoss
            | Code::Unauthenticated => Failure::Final,
        }
    }
}

/// How a call goes on after failures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// Consecutive transient failures retried before the last one is the answer.
    pub(crate) max_retries: usize,
    /// A failing server's first rest and the first backoff; each doubles per consecutive
    /// failure.
    pub(crate) backoff: Duration,
    /// A holder that cannot serve the call ([`Failure::Elsewhere`]) is passed over for the
    /// next; otherwise its answer is the call's.
    pub(crate) pass_elsewhere: bool,
    /// Each holder is asked at most once (a call any server may answer: the first to answer
    /// wins, and none is waited for).
    pub(crate) once: bool,
    /// A transient failure rests the server at once (other calls rank it last meanwhile);
    /// otherwise only when the call gives up on it (planning, which asks every server).
    pub(crate) rest_each_failure: bool,
}

impl Policy {
    /// Any of the holders may answer; each is asked once, in rank order.
    pub(crate) fn first_of(pass_elsewhere: bool) -> Self {
        Self {
            max_retries: usize::MAX,
            backoff: Duration::from_millis(100),
            pass_elsewhere,
            once: true,
            rest_each_failure: true,
        }
    }
}

/// What the caller does after a failed call.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Ask the next holder: this one cannot serve the call (or was asked once).
    Next,
    /// A transient failure, counted: ask again (another holder first; after a backoff
    /// when none works).
    Retry,
    /// The failure is the call's answer: final, or out of retries.
    Fail(tonic::Status),
}

/// One call's attempts over its holders.
#[derive(Debug)]
pub(crate) struct Attempts {
    holders: Vec<Arc<Member>>,
    /// Rotates ties in the ranking, so equal holders share the calls.
    spread: usize,
    policy: Policy,
    /// Consecutive transient failures, against `max_retries`.
    retries: usize,
    backoff: Duration,
    /// The servers asked, each once, in the order first asked.
    tried: Vec<String>,
    /// Servers that cannot serve the call, and why: never asked again for it.
    refused: Vec<(String, String)>,
}

impl Attempts {
    pub(crate) fn new(holders: Vec<Arc<Member>>, spread: usize, policy: Policy) -> Self {
        Self {
            holders,
            spread,
            retries: 0,
            backoff: policy.backoff,
            policy,
            tried: Vec::new(),
            refused: Vec::new(),
        }
    }

    /// The holder to ask next: the first ranked that has not refused the call (nor been
    /// asked, when each is asked once); `None` when none is left.
    pub(crate) fn next(&mut self) -> Option<Arc<Member>> {
        let node = Fleet::ranked(&self.holders, self.spread)
            .into_iter()
            .find(|n| self.may_ask(n))?;
        if !self.tried.contains(&node.url) {
            self.tried.push(node.url.clone());
        }
        Some(node)
    }

    fn may_ask(&self, node: &Member) -> bool {
        let refused = self.refused.iter().any(|(url, _)| *url == node.url);
        let asked = self.policy.once && self.tried.contains(&node.url);
        !refused && !asked
    }

    /// The call made progress (a stream delivered rows): the retry budget and the backoff
    /// are for consecutive failures.
    pub(crate) fn progressed(&mut self) {
        self.retries = 0;
        self.backoff = self.policy.backoff;
    }

    /// After `node` failed with `status`: rests it on a transient failure, passes it over
    /// when it cannot serve the call, and waits (backing off) only when no other holder
    /// works.
    pub(crate) async fn failed(&mut self, node: &Member, status: tonic::Status) -> Verdict {
        match Failure::of(status.code()) {
            Failure::Final => Verdict::Fail(status),
            Failure::Elsewhere if self.policy.pass_elsewhere => {
                let refusal = status_text(&status);
                tracing::warn!(server = %node.url, status = %refusal, "server cannot serve this; asking another");
                self.refused.push((node.url.clone(), refusal));
                Verdict::Next
            }
            Failure::Elsewhere => Verdict::Fail(status),
            Failure::Transient => {
                let out_of_retries = self.retries >= self.policy.max_retries;
                if self.policy.rest_each_failure || out_of_retries {
                    node.failed(self.policy.backoff);
                }
                if out_of_retries {
                    return Verdict::Fail(status);
                }
                self.retries += 1;
                tracing::warn!(
                    server = %node.url,
                    retry = self.retries,
                    status = %status_text(&status),
                    "server failed; asking again"
                );
                if self.policy.once {
                    return Verdict::Next;
                }
                // Straight to another working holder; wait only when every holder failed lately.
                let another = Fleet::ranked(&self.holders, self.spread)
                    .into_iter()
                    .find(|n| self.may_ask(n))
                    .is_some_and(|n| n.url != node.url);
                if !another || self.retries > self.holders.len() {
                    tokio::time::sleep(jittered(self.backoff)).await;
                    self.backoff = self.backoff.saturating_mul(2);
                }
                Verdict::Retry
            }
        }
    }

    /// Transient failures retried since the last progress.
    pub(crate) fn retries(&self) -> usize {
        self.retries
    }

    /// The servers asked, in the order first asked.
    pub(crate) fn take_tried(&mut self) -> Vec<String> {
        std::mem::take(&mut self.tried)
    }

    /// Each refusal, as `url: why`.
    pub(crate) fn refusals(&self) -> Vec<String> {
        self.refused
            .iter()
            .map(|(u, why)| format!("{u}: {why}"))
            .collect()
    }
}

/// A wait in [d/2, d]: retries of many streams do not arrive together.
fn jittered(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// Asks `nodes` in turn (ranked: best first), each once, until one answers: a call any
/// server, or any holder of a shard, may answer. When every node failed, the last failure;
/// with no node at all, `none`.
pub(crate) async fn first_answer<T, F, Fut>(
    nodes: Vec<Arc<Member>>,
    pass_elsewhere: bool,
    none: &str,
    ask: F,
) -> Result<T>
where
    F: Fn(Arc<Member>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut attempts = Attempts::new(nodes, 0, Policy::first_of(pass_elsewhere));
    let mut last = None;
    while let Some(node) = attempts.next() {
        match ask(Arc::clone(&node)).await {
            Ok(v) => {
                node.succeeded();
                return Ok(v);
            }
            Err(status) => match attempts.failed(&node, status.clone()).await {
                Verdict::Fail(status) => return Err(ClientError::server(&node.url, status)),
                Verdict::Next | Verdict::Retry => last = Some(ClientError::server(&node.url, status)),
            },
        }
    }
    Err(last.unwrap_or_else(|| ClientError::NoAnswer(none.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_sorted_by_what_a_retry_can_change() {
        assert_eq!(Failure::of(Code::Unavailable), Failure::Transient);
        assert_eq!(Failure::of(Code::DeadlineExceeded), Failure::Transient);
        assert_eq!(Failure::of(Code::FailedPrecondition), Failure::Elsewhere);
        assert_eq!(Failure::of(Code::NotFound), Failure::Elsewhere);
        assert_eq!(Failure::of(Code::InvalidArgument), Failure::Final);
        assert_eq!(Failure::of(Code::DataLoss), Failure::Final);
    }

    async fn lazy_nodes(n: usize) -> Vec<Arc<Member>> {
        let urls: Vec<String> = (1..=n).map(|i| format!("http://127.0.0.1:{i}")).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        Fleet::connect(&urls, crate::ConnectOptions::default())
            .await
            .expect("lazy connections")
            .nodes()
    }

    fn unavailable() -> tonic::Status {
        tonic::Status::unavailable("down")
    }

    /// A call any server may answer asks each once, in rank order, and takes the first
    /// answer; a final failure is the answer at once; with every server down, the last.
    #[tokio::test]
    async fn first_answer_asks_each_once_until_one_answers() {
        let nodes = lazy_nodes(3).await;
        let asked = parking_lot::Mutex::new(Vec::new());
        let answer = first_answer(nodes.clone(), false, "none", |node| {
            asked.lock().push(node.url.clone());
            let last = node.url == nodes[2].url;
            async move { if last { Ok(7) } else { Err(unavailable()) } }
        })
        .await
        .expect("the third answers");
        assert_eq!(answer, 7);
        let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
        assert_eq!(*asked.lock(), urls);

        let nodes = lazy_nodes(3).await;
        let e = first_answer(nodes.clone(), false, "none", |_| async {
            Err::<(), _>(tonic::Status::invalid_argument("bad query"))
        })
        .await
        .expect_err("final");
        assert!(e.to_string().contains("bad query"), "{e}");

        let calls = std::sync::atomic::AtomicUsize::new(0);
        let e = first_answer(nodes.clone(), false, "none", |_| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { Err::<(), _>(unavailable()) }
        })
        .await
        .expect_err("all down");
        assert_eq!(calls.into_inner(), 3, "each asked once");
        assert!(e.to_string().contains("down"), "{e}");
        let e = first_answer(Vec::new(), false, "no server to ask", |_| async { Ok(()) })
            .await
            .expect_err("nobody");
        assert_eq!(e.to_string(), "no server to ask");
    }

    /// A holder that cannot serve the call is passed over and never asked again; with every
    /// holder refusing, none is left and each refusal is named. Without passing, a refusal
    /// is the answer.
    #[tokio::test]
    async fn holders_that_refuse_are_never_asked_again() {
        let nodes = lazy_nodes(2).await;
        let policy = Policy {
            max_retries: 5,
            backoff: Duration::from_millis(1),
            pass_elsewhere: true,
            once: false,
            rest_each_failure: true,
        };
        let mut attempts = Attempts::new(nodes.clone(), 0, policy);
        let first = attempts.next().expect("a holder");
        let verdict = attempts
            .failed(&first, tonic::Status::not_found("no such file"))
            .await;
        assert!(matches!(verdict, Verdict::Next), "{verdict:?}");
        let second = attempts.next().expect("another holder");
        assert_ne!(second.url, first.url);
        let verdict = attempts
            .failed(&second, tonic::Status::failed_precondition("changed"))
            .await;
        assert!(matches!(verdict, Verdict::Next), "{verdict:?}");
        assert!(attempts.next().is_none());
        let refusals = attempts.refusals();
        assert_eq!(refusals.len(), 2);
        assert!(
            refusals[0].contains("no such file") && refusals[1].contains("changed"),
            "{refusals:?}"
        );

        let mut strict = Attempts::new(
            nodes,
            0,
            Policy {
                pass_elsewhere: false,
                ..policy
            },
        );
        let node = strict.next().unwrap();
        let verdict = strict
            .failed(&node, tonic::Status::not_found("no such file"))
            .await;
        assert!(matches!(verdict, Verdict::Fail(_)), "{verdict:?}");
    }

    /// Transient failures are retried up to the budget (counting consecutive ones only: any
    /// progress renews it), backing off on the one holder; then the failure is the answer.
    #[tokio::test]
    async fn transient_failures_are_retried_within_the_budget() {
        let nodes = lazy_nodes(1).await;
        let policy = Policy {
            max_retries: 2,
            backoff: Duration::from_millis(1),
            pass_elsewhere: true,
            once: false,
            rest_each_failure: true,
        };
        let mut attempts = Attempts::new(nodes, 0, policy);
        let mut verdicts = Vec::new();
        for round in 0..4 {
            let node = attempts.next().expect("the one holder stays");
            if round == 1 {
                attempts.progressed();
            }
            let verdict = attempts.failed(&node, unavailable()).await;
            verdicts.push(matches!(verdict, Verdict::Retry));
        }
        // Retried, progress renews the budget, retried twice more, then out of retries.
        assert_eq!(verdicts, [true, true, true, false]);
        assert_eq!(attempts.retries(), 2);
        assert_eq!(attempts.take_tried().len(), 1);
    }

    /// Planning asks every server and retries each on its own: a server it retries is not
    /// rested (ranked last by other calls) until planning gives up on it.
    #[tokio::test]
    async fn a_server_is_rested_when_the_call_gives_up_unless_each_failure_rests_it() {
        let nodes = lazy_nodes(1).await;
        let policy = Policy {
            max_retries: 1,
            backoff: Duration::from_secs(10),
            pass_elsewhere: false,
            once: true,
            rest_each_failure: false,
        };
        let mut attempts = Attempts::new(nodes.clone(), 0, policy);
        let node = attempts.next().unwrap();
        assert!(matches!(
            attempts.failed(&node, unavailable()).await,
            Verdict::Next
        ));
        assert!(!node.resting(std::time::Instant::now()), "retried, not rested");
        assert!(matches!(
            attempts.failed(&node, unavailable()).await,
            Verdict::Fail(_)
        ));
        assert!(node.resting(std::time::Instant::now()), "given up on: rested");

        let nodes = lazy_nodes(1).await;
        let mut attempts = Attempts::new(
            nodes,
            0,
            Policy {
                rest_each_failure: true,
                ..policy
            },
        );
        let node = attempts.next().unwrap();
        assert!(matches!(
            attempts.failed(&node, unavailable()).await,
            Verdict::Next
        ));
        assert!(node.resting(std::time::Instant::now()), "rested at once");
    }
}
