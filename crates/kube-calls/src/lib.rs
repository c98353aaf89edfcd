//! What gds-csi's Kubernetes controllers (node-loss, the dataset populator) share: every
//! API call under a deadline and named in its error, Events posted as client-go's
//! recorder posts them, their logging, and the loop of passes they run.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, ObjectList, PostParams};
use kube::Client;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: no answer within {1:?}")]
    Timeout(String, Duration),
    #[error("{0}: {1}")]
    Api(String, #[source] kube::Error),
    #[error("{0}: {1}")]
    Encode(String, #[source] serde_json::Error),
}

impl Error {
    /// The API server answered 404 (the object is gone or was never there).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api(_, kube::Error::Api(s)) if s.code == 404)
    }

    /// The API server answered 409 (the object exists, or changed since it was read).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api(_, kube::Error::Api(s)) if s.code == 409)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The client, the deadline of each call, and who posts the Events.
#[derive(Clone)]
pub struct Calls {
    pub client: Client,
    pub deadline: Duration,
    /// The reporting component (`gds-csi-node-loss`).
    pub component: &'static str,
    /// This replica (the pod's host name).
    pub instance: String,
}

impl Calls {
    pub fn new(client: Client, deadline: Duration, component: &'static str) -> Calls {
        Calls {
            client,
            deadline,
            component,
            instance: std::env::var("HOSTNAME").unwrap_or_else(|_| component.into()),
        }
    }

    /// `call` under the deadline, named `what` in its error.
    pub async fn call<T>(
        &self,
        what: impl Into<String>,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<T> {
        let what = what.into();
        match tokio::time::timeout(self.deadline, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Error::Api(what, e)),
            Err(_) => Err(Error::Timeout(what, self.deadline)),
        }
    }

    /// Every object a list call gives, in pages of `page` (the API server's `limit` and
    /// `continue`), each page under the deadline: a caller holds one page of objects at a
    /// time, not the whole cluster's. `each` sees every item, in the server's order.
    pub async fn list_pages<T, F, Fut>(
        &self,
        what: &str,
        page: u32,
        list: F,
        mut each: impl FnMut(T),
    ) -> Result<()>
    where
        T: Clone,
        F: Fn(ListParams) -> Fut,
        Fut: Future<Output = kube::Result<ObjectList<T>>>,
    {
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default().limit(page);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let got = self.call(what, list(params)).await?;
            token = got.metadata.continue_.filter(|t| !t.is_empty());
            got.items.into_iter().for_each(&mut each);
            if token.is_none() {
                return Ok(());
            }
        }
    }

    /// `create` of an object under a fixed name: true when this call made it, false when
    /// it was there already (409: an earlier pass or process made it).
    pub async fn create_once<T>(
        &self,
        what: impl Into<String>,
        create: impl Future<Output = kube::Result<T>>,
    ) -> Result<bool> {
        match self.call(what, create).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// An Event on `target` (`type_` Normal or Warning).
    pub async fn event(
        &self,
        target: &ObjectReference,
        type_: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let now = Time(Timestamp::now());
        // Cluster-scoped objects' events go to `default`, as client-go's recorder does.
        let ns = target.namespace.clone().unwrap_or_else(|| "default".into());
        let name = format!(
            "{}.{:x}",
            target.name.as_deref().unwrap_or(""),
            now.0.as_nanosecond()
        );
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: target.clone(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(type_.into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(EventSource {
                component: Some(self.component.into()),
                host: None,
            }),
            reporting_component: Some(self.component.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        self.call(
            format!("create event {reason} in {ns}"),
            api.create(&PostParams::default(), &ev),
        )
        .await?;
        Ok(())
    }
}

/// Logs to stderr as `text` or `json`, filtered by RUST_LOG (default `info`).
pub fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only on a terminal: a pod's log or a file gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// A controller that works in passes over the API's objects.
pub trait Passes {
    fn pass(&mut self) -> impl Future<Output = Result<()>>;
}

/// `p.pass()` every `interval` (a pass longer than it delays the next, never overlaps
/// it) until SIGTERM or SIGINT; a failed pass is logged and the next one tries again.
pub async fn run_passes<P: Passes>(p: &mut P, interval: Duration) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut term, mut int) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    );
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = p.pass().await {
                    tracing::error!(error = %e, "pass failed; retried at the next interval");
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    tracing::info!("stopping on a signal");
    Ok(())
}

/// A controller's exit status: the error logged, then failure.
pub fn exit_code(
    outcome: std::result::Result<(), Box<dyn std::error::Error>>,
) -> std::process::ExitCode {
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
    use std::sync::Mutex;

    #[tokio::test]
    async fn list_pages_follows_continue_tokens_to_the_end_with_the_page_limit() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let calls = Calls::new(
            Client::try_from(config).unwrap(),
            Duration::from_secs(5),
            "t",
        );
        let asked = Mutex::new(Vec::new());
        let list = |p: ListParams| {
            asked
                .lock()
                .unwrap()
                .push((p.limit, p.continue_token.clone()));
            let (items, next) = match p.continue_token.as_deref() {
                None => (vec![1, 2], Some("a")),
                Some("a") => (vec![3, 4], Some("b")),
                _ => (vec![5], Some("")),
            };
            let page = ObjectList {
                types: Default::default(),
                metadata: ListMeta {
                    continue_: next.map(str::to_owned),
                    ..ListMeta::default()
                },
                items,
            };
            async move { Ok(page) }
        };
        let mut seen = Vec::new();
        calls
            .list_pages("list numbers", 2, list, |n: i32| seen.push(n))
            .await
            .unwrap();
        assert_eq!(seen, [1, 2, 3, 4, 5]);
        let asked = asked.into_inner().unwrap();
        let tokens: Vec<_> = asked.iter().map(|(_, t)| t.as_deref()).collect();
        assert_eq!(tokens, [None, Some("a"), Some("b")]);
        assert!(asked.iter().all(|(limit, _)| *limit == Some(2)));
    }
}
