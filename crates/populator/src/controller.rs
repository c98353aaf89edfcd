//! One pass over the claims whose `dataSourceRef` names a Dataset: each moved one step
//! along the fill (prime claim, fill pod, the volume handed to the claim, clean-up), and
//! every Dataset's status written from what the pass saw. Everything the flow needs is in
//! the API objects, so a restarted populator takes up where the last one stopped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams,
};
use serde_json::json;
use tokio::time::Instant;
use tracing::{info, warn};

use gds_csi_kube::{Calls, Result};

use crate::dataset::{self, ClaimStatus, Spec, Status};
use crate::fill::{self, Fill, FillPlan, PodConfig, SELECTED_NODE};
use crate::metrics::{ClaimLabel, Metrics, OutcomeLabel, PhaseLabel};
use crate::report::Report;

pub const COMPONENT: &str = "gds-csi-populator";
/// Held on a claim while its fill's objects exist, so deleting the claim cleans them up.
pub const FINALIZER: &str = "gds-csi.io/populate";
/// On the volume handed to a claim: the Dataset it was filled from.
pub const POPULATED_FROM: &str = "gds-csi.io/populated-from";

pub struct Config {
    pub driver: String,
    pub fill: PodConfig,
    /// Time before a failed fill's pod is made again.
    pub retry_after: Duration,
}

pub struct Controller {
    calls: Calls,
    cfg: Config,
    /// Events posted, by claim uid: `reason|message`, so each is posted once.
    posted: HashMap<String, BTreeSet<String>>,
    /// When a claim's fill last failed, and why.
    failed: HashMap<String, (Instant, String)>,
    /// Bound claims, by uid: whether their volume was filled from their Dataset.
    filled: HashMap<String, bool>,
    metrics: Metrics,
}

/// A claim of ours: its uid, namespace and name, and its Dataset's name.
struct Claim<'a> {
    pvc: &'a PersistentVolumeClaim,
    uid: String,
    ns: String,
    name: String,
    dataset: String,
}

impl Claim<'_> {
    fn label(&self) -> String {
        format!("{}/{}", self.ns, self.dataset)
    }

    fn status(&self, phase: &str, message: impl Into<String>) -> ClaimStatus {
        ClaimStatus {
            claim: self.name.clone(),
            phase: phase.into(),
            message: message.into(),
            ..Default::default()
        }
    }

    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.ns.clone()),
            uid: Some(self.uid.clone()),
            ..Default::default()
        }
    }
}

/// The name of the Dataset a claim's `dataSourceRef` names, if it names one of ours.
fn dataset_of(pvc: &PersistentVolumeClaim) -> Option<String> {
    let r = pvc.spec.as_ref()?.data_source_ref.as_ref()?;
    let ours = r.api_group.as_deref() == Some(dataset::GROUP) && r.kind == dataset::KIND;
    (ours && !r.name.is_empty()).then(|| r.name.clone())
}

impl Controller {
    pub fn new(calls: Calls, cfg: Config, metrics: Metrics) -> Controller {
        Controller {
            calls,
            cfg,
            posted: HashMap::new(),
            failed: HashMap::new(),
            filled: HashMap::new(),
            metrics,
        }
    }

    async fn pass_counted(&mut self) -> Result<()> {
        let result = self.pass_inner().await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        let label = OutcomeLabel {
            outcome: outcome.into(),
        };
        self.metrics.passes.get_or_create(&label).inc();
        result
    }

    async fn pass_inner(&mut self) -> Result<()> {
        let claims: Api<PersistentVolumeClaim> = Api::all(self.calls.client.clone());
        let list = self
            .calls
            .call("list claims", claims.list(&ListParams::default()))
            .await?;
        let mut by_dataset: BTreeMap<(String, String), Vec<ClaimStatus>> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for pvc in &list.items {
            let Some(c) = self.claim_of(pvc) else {
                continue;
            };
            seen.insert(c.uid.clone());
            match self.step(&c).await {
                Ok(Some(st)) => by_dataset
                    .entry((c.ns.clone(), c.dataset.clone()))
                    .or_default()
                    .push(st),
                Ok(None) => {}
                Err(e) => {
                    warn!(claim = %format!("{}/{}", c.ns, c.name), error = %e, "fill step failed; retried next pass")
                }
            }
        }
        // What is remembered of claims gone since.
        self.posted.retain(|uid, _| seen.contains(uid));
        self.failed.retain(|uid, _| seen.contains(uid));
        self.filled.retain(|uid, _| seen.contains(uid));
        self.update_gauges(&by_dataset);
        self.write_statuses(by_dataset).await
    }

    /// The gauges as this pass saw the claims: fills no longer under way drop out.
    fn update_gauges(&self, by_dataset: &BTreeMap<(String, String), Vec<ClaimStatus>>) {
        self.metrics.copied.clear();
        self.metrics.total.clear();
        self.metrics.claims.clear();
        for ((ns, dataset), claims) in by_dataset {
            for c in claims {
                let phase = PhaseLabel {
                    phase: c.phase.clone(),
                };
                self.metrics.claims.get_or_create(&phase).inc();
                if c.phase != "Copying" {
                    continue;
                }
                let label = ClaimLabel {
                    namespace: ns.clone(),
                    claim: c.claim.clone(),
                    dataset: dataset.clone(),
                };
                let gauge = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
                self.metrics
                    .copied
                    .get_or_create(&label)
                    .set(gauge(c.copied_bytes));
                self.metrics
                    .total
                    .get_or_create(&label)
                    .set(gauge(c.total_bytes));
            }
        }
    }

    fn claim_of<'a>(&mut self, pvc: &'a PersistentVolumeClaim) -> Option<Claim<'a>> {
        let m = &pvc.metadata;
        let ns = m.namespace.clone()?;
        // The populator's own claims (the primes) are never populated.
        if ns == self.cfg.fill.namespace {
            return None;
        }
        let dataset = dataset_of(pvc)?;
        Some(Claim {
            pvc,
            uid: m.uid.clone()?,
            ns,
            name: m.name.clone()?,
            dataset,
        })
    }

    /// One step of `c`'s fill; the claim's entry in its Dataset's status, if it has one.
    async fn step(&mut self, c: &Claim<'_>) -> Result<Option<ClaimStatus>> {
        let cross = c
            .pvc
            .spec
            .as_ref()
            .and_then(|s| s.data_source_ref.as_ref())
            .and_then(|r| r.namespace.clone());
        if cross.is_some_and(|n| n != c.ns) {
            let m = "spec.dataSourceRef.namespace: a Dataset fills claims of its own namespace only; create the Dataset in the claim's namespace";
            self.once(c, "Warning", "InvalidDataSource", m).await?;
            return Ok(None);
        }
        if c.pvc.metadata.deletion_timestamp.is_some() {
            self.clean_up(c).await?;
            return Ok(None);
        }
        let bound = c
            .pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_ref())
            .is_some();
        if bound {
            return self.finish(c).await;
        }
        // A fill under way goes on with what its prime claim recorded: a Dataset changed
        // or deleted since changes nothing in it.
        match self.prime(c).await? {
            Some(prime) => self.follow(c, &prime).await.map(Some),
            None => self.start(c).await,
        }
    }

    /// A claim whose fill has not started: its Dataset and class checked, then (once the
    /// scheduler chose a node, where the class waits for one) its prime claim made.
    async fn start(&mut self, c: &Claim<'_>) -> Result<Option<ClaimStatus>> {
        let datasets: Api<DynamicObject> =
            Api::namespaced_with(self.calls.client.clone(), &c.ns, &dataset::resource());
        let found = self
            .calls
            .call(
                format!("get dataset {}", c.label()),
                datasets.get_opt(&c.dataset),
            )
            .await?;
        let Some(ds) = found else {
            let m = format!("Dataset {} not found: the claim waits until it exists (kubectl get datasets -n {})", c.label(), c.ns);
            self.once(c, "Warning", "DatasetNotFound", &m).await?;
            return Ok(None);
        };
        let spec = ds.data.get("spec").cloned().unwrap_or_default();
        let parsed = serde_json::from_value::<Spec>(spec).map_err(|e| format!("spec: {e}"));
        let root = self.cfg.fill.node_root.as_deref();
        let checked = parsed.and_then(|spec| Ok((dataset::source(&spec, root)?, spec)));
        let (source, spec) = match checked {
            Ok(s) => s,
            Err(m) => {
                return self
                    .refuse(c, "InvalidDataset", &format!("Dataset {}: {m}", c.label()))
                    .await
            }
        };
        let spec_of = c.pvc.spec.clone().unwrap_or_default();
        let Some(class) = self.class(spec_of.storage_class_name.as_deref()).await? else {
            return Ok(None);
        };
        if spec_of.volume_mode.as_deref() == Some("Block") {
            let m = "a Dataset fills claims of volumeMode Filesystem only (a tree of files needs a filesystem); drop volumeMode: Block";
            return self.refuse(c, "InvalidDataSource", m).await;
        }
        let wffc = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
        let node = c
            .pvc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SELECTED_NODE))
            .cloned();
        if wffc && node.is_none() {
            return Ok(Some(c.status(
                "Pending",
                "waiting for a pod to use the claim (the class binds on first use)",
            )));
        }
        self.finalizer(c, true).await?;
        let plan = FillPlan {
            source,
            verify: spec.verify.clone().unwrap_or_else(|| "sizes".into()),
            label: c.label(),
        };
        self.make_prime(c, node.as_deref(), &plan).await?;
        Ok(Some(c.status("Pending", "waiting for the volume")))
    }

    /// A started fill moved on: its volume waited for, its pod made or followed.
    async fn follow(
        &mut self,
        c: &Claim<'_>,
        prime: &PersistentVolumeClaim,
    ) -> Result<ClaimStatus> {
        let node = prime
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SELECTED_NODE))
            .cloned();
        let plan = match FillPlan::of(prime) {
            Ok(p) => p,
            Err(m) => {
                let m = format!(
                    "the fill's prime claim {}: {m}; delete the claim and create it again",
                    fill::prime_name(&c.uid)
                );
                self.once(c, "Warning", "FillFailed", &m).await?;
                let mut st = c.status("Failed", &m);
                st.last_error = m;
                return Ok(st);
            }
        };
        let Some(pv) = prime.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
            let on = node
                .as_deref()
                .map(|n| format!(" on node {n}"))
                .unwrap_or_default();
            return Ok(c.status("Pending", format!("waiting for the volume{on}")));
        };
        let f = Fill {
            uid: &c.uid,
            source: &plan.source,
            verify: &plan.verify,
            label: &plan.label,
            node: node.as_deref(),
        };
        let mut st = self.run_pod(c, &f, &pv).await?;
        st.node = node.unwrap_or_default();
        Ok(st)
    }

    /// A claim that cannot be filled as it is: a Warning once, and Failed in the status.
    async fn refuse(
        &mut self,
        c: &Claim<'_>,
        reason: &str,
        m: &str,
    ) -> Result<Option<ClaimStatus>> {
        self.once(c, "Warning", reason, m).await?;
        let mut st = c.status("Failed", m);
        st.last_error = m.into();
        Ok(Some(st))
    }

    /// The claim's class, if this driver provisions it.
    async fn class(&self, name: Option<&str>) -> Result<Option<StorageClass>> {
        let Some(name) = name else { return Ok(None) };
        let api: Api<StorageClass> = Api::all(self.calls.client.clone());
        let sc = self
            .calls
            .call(format!("get storage class {name}"), api.get_opt(name))
            .await?;
        Ok(sc.filter(|sc| sc.provisioner == self.cfg.driver))
    }

    fn primes(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.calls.client.clone(), &self.cfg.fill.namespace)
    }

    async fn prime(&self, c: &Claim<'_>) -> Result<Option<PersistentVolumeClaim>> {
        let name = fill::prime_name(&c.uid);
        let api = self.primes();
        self.calls
            .call(format!("get claim {name}"), api.get_opt(&name))
            .await
    }

    async fn make_prime(
        &mut self,
        c: &Claim<'_>,
        node: Option<&str>,
        plan: &FillPlan,
    ) -> Result<()> {
        let name = fill::prime_name(&c.uid);
        let prime = fill::prime_claim(c.pvc, &c.uid, &self.cfg.fill, node, plan);
        let api = self.primes();
        self.calls
            .create_once(
                format!("create claim {name}"),
                api.create(&PostParams::default(), &prime),
            )
            .await?;
        let on = node.map(|n| format!(" on node {n}")).unwrap_or_default();
        self.once(
            c,
            "Normal",
            "FillStarted",
            &format!("filling from Dataset {}{on}", c.label()),
        )
        .await
    }

    /// The fill pod made, followed, or its outcome taken: a finished copy hands the
    /// volume `pv` to the claim.
    async fn run_pod(&mut self, c: &Claim<'_>, f: &Fill<'_>, pv: &str) -> Result<ClaimStatus> {
        let pods: Api<Pod> = Api::namespaced(self.calls.client.clone(), &self.cfg.fill.namespace);
        let name = fill::pod_name(&c.uid);
        let Some(pod) = self
            .calls
            .call(format!("get pod {name}"), pods.get_opt(&name))
            .await?
        else {
            return self.start_pod(c, f, &pods).await;
        };
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let log = self.log(&pods, &name).await;
        let report = log.as_deref().and_then(Report::last_in).unwrap_or_default();
        match phase.as_str() {
            "Succeeded" => {
                self.hand_over(c, pv).await?;
                Ok(self.copying(
                    c,
                    &report,
                    "copied and verified; handing the volume to the claim",
                ))
            }
            "Failed" => {
                let why = match report.phase.as_str() {
                    "Failed" => report.message.clone(),
                    _ => format!("the fill pod {name} failed: {}", pod_message(&pod)),
                };
                self.once(
                    c,
                    "Warning",
                    "FillFailed",
                    &format!("{why}; retried in {:?}", self.cfg.retry_after),
                )
                .await?;
                self.failed.insert(c.uid.clone(), (Instant::now(), why));
                self.metrics.failures.inc();
                self.calls
                    .call(
                        format!("delete pod {name}"),
                        pods.delete(&name, &DeleteParams::default()),
                    )
                    .await?;
                Ok(self.copying(c, &report, "failed; retried"))
            }
            _ if report.phase.is_empty() => {
                // Nothing printed yet: what holds the pod (an image, a mount, scheduling).
                let m = format!("the fill pod {name} is starting: {}", pod_waiting(&pod));
                Ok(self.copying(c, &report, &m))
            }
            _ => {
                self.progress_event(c, &report).await?;
                Ok(self.copying(c, &report, &report.message))
            }
        }
    }

    async fn start_pod(
        &mut self,
        c: &Claim<'_>,
        f: &Fill<'_>,
        pods: &Api<Pod>,
    ) -> Result<ClaimStatus> {
        if let Some((at, why)) = self.failed.get(&c.uid) {
            if at.elapsed() < self.cfg.retry_after {
                let mut st = c.status("Failed", why.clone());
                st.last_error = why.clone();
                return Ok(st);
            }
        }
        let pod = fill::fill_pod(&self.cfg.fill, f);
        let name = fill::pod_name(&c.uid);
        let made = self
            .calls
            .create_once(
                format!("create pod {name}"),
                pods.create(&PostParams::default(), &pod),
            )
            .await?;
        if made {
            info!(claim = %format!("{}/{}", c.ns, c.name), pod = %name, "fill pod made");
        }
        Ok(c.status("Copying", "starting the copy"))
    }

    fn copying(&self, c: &Claim<'_>, r: &Report, message: &str) -> ClaimStatus {
        let mut st = c.status("Copying", message);
        (st.copied_bytes, st.total_bytes, st.entries) = (r.copied_bytes, r.total_bytes, r.entries);
        st.bytes_per_second = r.bytes_per_second;
        st.eta_seconds = dataset::eta(r.copied_bytes, r.total_bytes, r.bytes_per_second);
        st.last_error = self
            .failed
            .get(&c.uid)
            .map(|(_, w)| w.clone())
            .unwrap_or_default();
        st
    }

    /// An event at each quarter of the copy.
    async fn progress_event(&mut self, c: &Claim<'_>, r: &Report) -> Result<()> {
        if r.phase != "Copying" || r.total_bytes == 0 {
            return Ok(());
        }
        let quarter = r.percent() / 25 * 25;
        if quarter == 0 || quarter == 100 {
            return Ok(());
        }
        let key = format!("FillProgress|{quarter}");
        if self.posted.get(&c.uid).is_some_and(|p| p.contains(&key)) {
            return Ok(());
        }
        let m = format!("{quarter}% copied: {}", r.message);
        self.calls
            .event(&c.reference(), "Normal", "FillProgress", &m)
            .await?;
        self.posted.entry(c.uid.clone()).or_default().insert(key);
        Ok(())
    }

    async fn log(&self, pods: &Api<Pod>, name: &str) -> Option<String> {
        let params = LogParams {
            tail_lines: Some(8),
            ..Default::default()
        };
        self.calls
            .call(
                format!("read the log of pod {name}"),
                pods.logs(name, &params),
            )
            .await
            .ok()
    }

    /// The prime claim's volume given to the claim: its claimRef moved, which the PV
    /// controller then completes (the claim bound, the prime claim Lost).
    async fn hand_over(&self, c: &Claim<'_>, pv: &str) -> Result<()> {
        let api: Api<PersistentVolume> = Api::all(self.calls.client.clone());
        let Some(vol) = self
            .calls
            .call(format!("get volume {pv}"), api.get_opt(pv))
            .await?
        else {
            return Ok(());
        };
        let to = vol.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        if to.and_then(|r| r.uid.as_deref()) == Some(c.uid.as_str()) {
            return Ok(());
        }
        let patch = json!({
            "metadata": {"annotations": {POPULATED_FROM: c.label()}},
            "spec": {"claimRef": {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": c.ns, "name": c.name, "uid": c.uid,
                "resourceVersion": c.pvc.metadata.resource_version,
            }},
        });
        self.calls
            .call(
                format!("hand volume {pv} to claim {}/{}", c.ns, c.name),
                api.patch(pv, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
        info!(claim = %format!("{}/{}", c.ns, c.name), volume = %pv, "filled volume handed to the claim");
        Ok(())
    }

    /// A bound claim: the fill's objects removed once it holds the volume.
    async fn finish(&mut self, c: &Claim<'_>) -> Result<Option<ClaimStatus>> {
        let ours = c
            .pvc
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
        if ours {
            self.clean_up(c).await?;
            self.once(
                c,
                "Normal",
                "Filled",
                &format!("filled from Dataset {} and verified", c.label()),
            )
            .await?;
            self.filled.insert(c.uid.clone(), true);
        }
        self.failed.remove(&c.uid);
        let done = c.status("Done", format!("filled from Dataset {}", c.label()));
        Ok(self.filled_from_it(c).await?.then_some(done))
    }

    /// Whether a bound claim's volume was filled from its Dataset (a claim bound some
    /// other way is not listed as filled); asked of its volume once, then remembered.
    async fn filled_from_it(&mut self, c: &Claim<'_>) -> Result<bool> {
        if let Some(&known) = self.filled.get(&c.uid) {
            return Ok(known);
        }
        let Some(pv) = c.pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
            return Ok(false);
        };
        let api: Api<PersistentVolume> = Api::all(self.calls.client.clone());
        let vol = self
            .calls
            .call(format!("get volume {pv}"), api.get_opt(&pv))
            .await?;
        let from = vol
            .as_ref()
            .and_then(|v| v.metadata.annotations.as_ref())
            .and_then(|a| a.get(POPULATED_FROM));
        let known = from == Some(&c.label());
        self.filled.insert(c.uid.clone(), known);
        Ok(known)
    }

    /// The fill pod and the prime claim deleted (a prime claim whose volume was not
    /// handed over takes it with it), then the claim's finalizer.
    async fn clean_up(&mut self, c: &Claim<'_>) -> Result<()> {
        let ns = self.cfg.fill.namespace.clone();
        let pods: Api<Pod> = Api::namespaced(self.calls.client.clone(), &ns);
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.calls.client.clone(), &ns);
        for (kind, name) in [
            ("pod", fill::pod_name(&c.uid)),
            ("claim", fill::prime_name(&c.uid)),
        ] {
            let deleted = match kind {
                "pod" => self
                    .calls
                    .call(
                        format!("delete pod {name}"),
                        pods.delete(&name, &DeleteParams::default()),
                    )
                    .await
                    .map(drop),
                _ => self
                    .calls
                    .call(
                        format!("delete claim {name}"),
                        claims.delete(&name, &DeleteParams::default()),
                    )
                    .await
                    .map(drop),
            };
            match deleted {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        self.finalizer(c, false).await?;
        self.posted.remove(&c.uid);
        Ok(())
    }

    /// Our finalizer added to or removed from the claim (conditional on the claim not
    /// having changed since it was listed: a conflict is retried next pass).
    async fn finalizer(&self, c: &Claim<'_>, want: bool) -> Result<()> {
        let now: Vec<String> = c.pvc.metadata.finalizers.clone().unwrap_or_default();
        let has = now.iter().any(|f| f == FINALIZER);
        if has == want {
            return Ok(());
        }
        let mut next: Vec<String> = now.into_iter().filter(|f| f != FINALIZER).collect();
        if want {
            next.push(FINALIZER.into());
        }
        let patch = json!({"metadata": {"finalizers": next, "resourceVersion": c.pvc.metadata.resource_version}});
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.calls.client.clone(), &c.ns);
        self.calls
            .call(
                format!("set finalizers of claim {}/{}", c.ns, c.name),
                api.patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
        Ok(())
    }

    /// An event on the claim, once per reason and message.
    async fn once(
        &mut self,
        c: &Claim<'_>,
        type_: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let key = format!("{reason}|{message}");
        if self.posted.get(&c.uid).is_some_and(|p| p.contains(&key)) {
            return Ok(());
        }
        self.calls
            .event(&c.reference(), type_, reason, message)
            .await?;
        self.posted.entry(c.uid.clone()).or_default().insert(key);
        Ok(())
    }

    /// Every Dataset's status from this pass's claims (none: its claims list emptied).
    async fn write_statuses(
        &self,
        mut by_dataset: BTreeMap<(String, String), Vec<ClaimStatus>>,
    ) -> Result<()> {
        let all: Api<DynamicObject> =
            Api::all_with(self.calls.client.clone(), &dataset::resource());
        let list = self
            .calls
            .call("list datasets", all.list(&ListParams::default()))
            .await?;
        for ds in list.items {
            let (Some(ns), Some(name)) = (ds.metadata.namespace.clone(), ds.metadata.name.clone())
            else {
                continue;
            };
            let before: Status = ds
                .data
                .get("status")
                .cloned()
                .and_then(|s| serde_json::from_value(s).ok())
                .unwrap_or_default();
            let now = Status::of(
                by_dataset
                    .remove(&(ns.clone(), name.clone()))
                    .unwrap_or_default(),
                &before,
            );
            if now == before {
                continue;
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.calls.client.clone(), &ns, &dataset::resource());
            let patch = json!({"status": now});
            if let Err(e) = self
                .calls
                .call(
                    format!("write the status of dataset {ns}/{name}"),
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await
            {
                warn!(error = %e, "status not written; written next pass");
            }
        }
        Ok(())
    }
}

/// The fill container's state (the pod has one container).
fn container_state(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerState> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.first()?.state.as_ref()
}

fn pod_message(pod: &Pod) -> String {
    let s = pod.status.as_ref();
    let term = container_state(pod)
        .and_then(|st| st.terminated.as_ref())
        .map(|t| {
            format!(
                "exit code {}{}",
                t.exit_code,
                t.reason
                    .as_ref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )
        });
    term.or_else(|| s.and_then(|s| s.message.clone()))
        .unwrap_or_else(|| "no reason given".into())
}

impl gds_csi_kube::Passes for Controller {
    async fn pass(&mut self) -> Result<()> {
        self.pass_counted().await
    }
}

/// Why a pod that printed nothing yet is not running: its container's waiting reason, or
/// the reason it is not scheduled.
fn pod_waiting(pod: &Pod) -> String {
    let s = pod.status.as_ref();
    let waiting = container_state(pod)
        .and_then(|st| st.waiting.as_ref())
        .map(|w| {
            format!(
                "{} {}",
                w.reason.clone().unwrap_or_default(),
                w.message.clone().unwrap_or_default()
            )
        });
    let unscheduled = s
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.status == "False" && c.message.is_some())
        })
        .and_then(|c| c.message.clone());
    waiting
        .or(unscheduled)
        .map(|m| m.trim().to_owned())
        .unwrap_or_else(|| {
            format!(
                "phase {}",
                s.and_then(|s| s.phase.clone()).unwrap_or_default()
            )
        })
}
