//! One pass over Nodes and PersistentVolumes, and the two actions.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use gds_csi_kube::Calls;
use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::Client;
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::claim::{pod_uses_claim, template, PVC_PROTECTION};
use crate::clock::{Clock, NodeState};
use crate::metrics::{Metrics, NodeAction, NodeLabel, OutcomeLabel, StateLabel};
use crate::volumes::{ClaimRef, LocalVolume, Selector, Skip};

pub const COMPONENT: &str = "gds-csi-node-loss";

/// Objects per page of a pass's lists: the controller holds one page at a time, so its
/// memory does not grow with the cluster's Nodes and PVs (only with our local volumes).
const LIST_PAGE: u32 = 500;

/// The PV protection finalizer, removed by Kubernetes once no claim is bound (kubernetes
/// pkg/volume/util/finalizer.go:24); by then the old claim is gone, so it goes at once.
const PV_FINALIZERS: &[&str] = &["kubernetes.io/pv-protection"];

/// The external-provisioner's finalizer is kept: that node's provisioner (distributed
/// mode) still handles a deleted PV holding it (sig-storage-lib-external-provisioner v13
/// controller/controller.go:1294-1299), so if the node comes back under its name it calls
/// DeleteVolume and its driver frees and erases the volume, then removes the finalizer.
const PROVISIONER_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// An Event on the claim and the metric; nothing else.
    Report,
    /// Delete the PV and re-create the claim unbound.
    Recreate,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Report => "report",
            Action::Recreate => "recreate",
        }
    }
}

pub use gds_csi_kube::Error;

type Result<T> = std::result::Result<T, Error>;

pub struct Config {
    pub selector: Selector,
    pub grace: Duration,
    pub action: Action,
    pub api_timeout: Duration,
}

pub struct Controller {
    client: Client,
    cfg: Config,
    clock: Clock,
    metrics: Metrics,
    /// PVs (by uid) reported in this loss of their node: one Event each, not one a pass.
    reported: HashSet<String>,
    /// Nodes announced missing, so the log says when a loss starts and ends.
    announced: BTreeSet<String>,
    /// PVs of ours passed over as ambiguous, logged once each.
    warned: HashSet<String>,
    calls: Calls,
}

/// What `recreate` got to this pass.
#[derive(Debug, PartialEq, Eq)]
enum Progress {
    Done,
    Waiting(String),
}

impl Controller {
    pub fn new(client: Client, cfg: Config, metrics: Metrics) -> Self {
        Controller {
            calls: Calls::new(client.clone(), cfg.api_timeout, COMPONENT),
            client,
            cfg,
            clock: Clock::default(),
            metrics,
            reported: HashSet::new(),
            announced: BTreeSet::new(),
            warned: HashSet::new(),
        }
    }

    async fn pass_counted(&mut self) -> Result<()> {
        let began = Instant::now();
        let result = self.pass_inner().await;
        let seconds = began.elapsed().as_secs_f64();
        self.metrics.pass_seconds.observe(seconds);
        debug!(elapsed_ms = seconds * 1e3, "pass");
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.metrics
            .passes
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
        result
    }

    async fn pass_inner(&mut self) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let present = self.present_nodes(&nodes).await?;
        let by_node = self.volumes_by_node().await?;
        let wanted: BTreeSet<String> = by_node.keys().cloned().collect();
        let states = self
            .clock
            .observe(&present, &wanted, Instant::now(), self.cfg.grace);
        self.update_gauges(&states, &by_node);

        let mut still_lost = HashSet::new();
        for (node, state) in &states {
            let volumes = &by_node[node];
            match *state {
                NodeState::Present => {
                    if self.announced.remove(node) {
                        info!(%node, volumes = volumes.len(), "node is back before its grace period ended: nothing changed");
                    }
                }
                NodeState::InGrace(gone) => {
                    if self.announced.insert(node.clone()) {
                        info!(%node, volumes = volumes.len(), grace = ?self.cfg.grace, action = self.cfg.action.as_str(),
                            "node object is absent; acting after the grace period unless it comes back");
                    } else {
                        debug!(%node, ?gone, "node still absent, within the grace period");
                    }
                }
                NodeState::Lost(gone) => {
                    self.node_lost(&nodes, node, volumes, gone, &mut still_lost)
                        .await?;
                }
            }
        }
        self.announced.retain(|n| wanted.contains(n));
        self.reported.retain(|uid| still_lost.contains(uid));
        Ok(())
    }

    /// The names of the Nodes the API lists now.
    async fn present_nodes(&mut self, nodes: &Api<Node>) -> Result<BTreeSet<String>> {
        let mut names = BTreeSet::new();
        let listed = self
            .calls
            .list_pages(
                "list nodes",
                LIST_PAGE,
                |p| async move { nodes.list_metadata(&p).await },
                |n| names.extend(n.metadata.name),
            )
            .await;
        match listed {
            Ok(()) => Ok(names),
            Err(e) => {
                // Absence seen with a gap proves nothing: start every clock again.
                if !self.announced.is_empty() {
                    warn!(error = %e, "could not list Nodes: every missing node's grace period starts again");
                }
                self.clock.reset();
                Err(e)
            }
        }
    }

    /// Our volumes, by the node whose drives hold them; a PV whose node is ambiguous is
    /// left alone (and logged once).
    async fn volumes_by_node(&mut self) -> Result<BTreeMap<String, Vec<LocalVolume>>> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let (selector, warned) = (&self.cfg.selector, &mut self.warned);
        let mut by_node: BTreeMap<String, Vec<LocalVolume>> = BTreeMap::new();
        self.calls
            .list_pages(
                "list persistentvolumes",
                LIST_PAGE,
                |p| {
                    let pvs = pvs.clone();
                    async move { pvs.list(&p).await }
                },
                |pv| match selector.select(&pv) {
                    Ok(v) => by_node.entry(v.node.clone()).or_default().push(v),
                    Err(Skip::Ambiguous(why)) => {
                        let name = pv.metadata.name.clone().unwrap_or_default();
                        if warned.insert(name.clone()) {
                            warn!(pv = %name, %why, "left alone: cannot tell which node holds this volume");
                        }
                    }
                    Err(_) => {}
                },
            )
            .await?;
        Ok(by_node)
    }

    /// A node past its grace period: the action on each of its volumes, once a direct
    /// read confirms the node is gone. The uids of the volumes acted on go in `still_lost`.
    async fn node_lost(
        &mut self,
        nodes: &Api<Node>,
        node: &str,
        volumes: &[LocalVolume],
        gone: Duration,
        still_lost: &mut HashSet<String>,
    ) -> Result<()> {
        self.announced.insert(node.to_owned());
        // The list may be stale or partial: act only on a 404 for this node now.
        let exists = self
            .calls
            .call(format!("get node {node}"), nodes.get_metadata_opt(node))
            .await?;
        if exists.is_some() {
            info!(%node, "node is back (seen by a direct read); nothing changed");
            return Ok(());
        }
        for v in volumes {
            still_lost.insert(v.pv_uid.clone());
            let outcome = match self.cfg.action {
                Action::Report => self.report(v, gone).await.map(|()| Progress::Done),
                Action::Recreate => self.recreate(v, gone).await,
            };
            match outcome {
                Ok(Progress::Done) => {}
                Ok(Progress::Waiting(why)) => {
                    info!(pv = %v.pv_name, %node, %why, "claim re-creation waiting")
                }
                Err(e) => {
                    warn!(pv = %v.pv_name, %node, error = %e, "node loss action failed; retried next pass")
                }
            }
        }
        Ok(())
    }

    fn update_gauges(
        &self,
        states: &BTreeMap<String, NodeState>,
        by_node: &BTreeMap<String, Vec<LocalVolume>>,
    ) {
        let (mut in_grace, mut lost) = (0, 0);
        self.metrics.claims.clear();
        for (node, state) in states {
            match state {
                NodeState::Present => {}
                NodeState::InGrace(_) => in_grace += 1,
                NodeState::Lost(_) => {
                    lost += 1;
                    self.metrics
                        .claims
                        .get_or_create(&NodeAction {
                            node: node.clone(),
                            action: self.cfg.action.as_str().into(),
                        })
                        .set(by_node[node].len() as i64);
                }
            }
        }
        for (state, n) in [("in_grace", in_grace), ("lost", lost)] {
            self.metrics
                .missing_nodes
                .get_or_create(&StateLabel {
                    state: state.into(),
                })
                .set(n);
        }
    }

    fn message(&self, v: &LocalVolume, gone: Duration) -> String {
        format!(
            "node {} has been deleted for {} (grace period {}): volume {} on its drives can never be used again",
            v.node,
            humantime::format_duration(Duration::from_secs(gone.as_secs())),
            humantime::format_duration(self.cfg.grace),
            v.pv_name
        )
    }

    /// The old claim if it is still the one the PV was bound to (same uid, bound to
    /// this PV); local-static-provisioner checks the same before deleting
    /// (pkg/node-cleanup/controller/controller.go:230).
    async fn bound_claim(&self, v: &LocalVolume) -> Result<Option<PersistentVolumeClaim>> {
        let Some(c) = &v.claim else { return Ok(None) };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let pvc = self
            .calls
            .call(
                format!("get claim {}/{}", c.namespace, c.name),
                api.get_opt(&c.name),
            )
            .await?;
        Ok(pvc.filter(|p| {
            p.metadata.uid.as_deref() == Some(c.uid.as_str())
                && p.spec.as_ref().and_then(|s| s.volume_name.as_deref())
                    == Some(v.pv_name.as_str())
        }))
    }

    async fn report(&mut self, v: &LocalVolume, gone: Duration) -> Result<()> {
        if self.reported.contains(&v.pv_uid) {
            return Ok(());
        }
        let message = format!(
            "{}; action report: nothing changed (delete the claim and its PV to get a new volume, or run the node-loss controller with action recreate)",
            self.message(v, gone)
        );
        let target = match self.bound_claim(v).await? {
            Some(pvc) => claim_ref(&pvc),
            None => pv_ref(v),
        };
        self.calls
            .event(&target, "Warning", "NodeLost", &message)
            .await?;
        warn!(pv = %v.pv_name, node = %v.node, claim = ?v.claim.as_ref().map(|c| format!("{}/{}", c.namespace, c.name)),
            gone = ?Duration::from_secs(gone.as_secs()), "node lost: reported (Event NodeLost), nothing changed");
        self.reported.insert(v.pv_uid.clone());
        Ok(())
    }

    /// Each step is idempotent and checks the state it starts from, so a pass that
    /// stops anywhere (an error, a restart) is taken up by the next:
    /// 1. the claim's template is written on the PV (annotation) before the claim is
    ///    deleted, so a restart between 2 and 3 can still re-create it;
    /// 2. the old claim (same uid, bound to this PV) is deleted with a uid precondition
    ///    (as local-static-provisioner's deletePVC, controller.go:296) and, once no pod
    ///    uses it, its pvc-protection finalizer is removed if Kubernetes has not yet;
    /// 3. the claim is created again from the template, unbound;
    /// 4. the PV is deleted and its protection finalizer removed, the provisioner's kept
    ///    for the node's return (local-static-provisioner deletes such PVs too, deleter.go:96-98;
    ///    TopoLVM's node finalizer deletes the claims of a deleted node,
    ///    internal/controller/node_controller.go:122).
    async fn recreate(&mut self, v: &LocalVolume, gone: Duration) -> Result<Progress> {
        let pv_api: Api<PersistentVolume> = Api::all(self.client.clone());
        let Some(pv) = self
            .calls
            .call(format!("get pv {}", v.pv_name), pv_api.get_opt(&v.pv_name))
            .await?
        else {
            return Ok(Progress::Done);
        };
        let key = self.template_annotation();
        if pv.metadata.uid.as_deref() != Some(v.pv_uid.as_str()) || awaits_its_node(&pv, &key) {
            return Ok(Progress::Done);
        }
        let mut saved = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&key))
            .cloned();

        if let (Some(c), Some(old)) = (&v.claim, self.bound_claim(v).await?) {
            if saved.is_none() {
                saved = Some(self.save_template(v, c, &old, &key).await?);
            }
            if old.metadata.deletion_timestamp.is_none() {
                self.delete_bound_claim(v, c, &old, gone).await?;
            }
            if let Progress::Waiting(why) = self.release_deleted_claim(v, c).await? {
                return Ok(Progress::Waiting(why));
            }
        }
        self.recreate_claim_and_delete_pv(v, saved.as_deref()).await
    }

    /// Step 1: the template of claim `old` written on the PV under annotation `key`;
    /// answers the text written.
    async fn save_template(
        &self,
        v: &LocalVolume,
        c: &ClaimRef,
        old: &PersistentVolumeClaim,
        key: &str,
    ) -> Result<String> {
        let text = serde_json::to_string(&template(old))
            .map_err(|e| Error::Encode(format!("serialize claim {}/{}", c.namespace, c.name), e))?;
        let patch = json!({"metadata": {"annotations": {key: &text}}});
        let pv_api: Api<PersistentVolume> = Api::all(self.client.clone());
        self.calls
            .call(
                format!("annotate pv {} with its claim", v.pv_name),
                pv_api.patch(&v.pv_name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
        info!(pv = %v.pv_name, claim = %format!("{}/{}", c.namespace, c.name), "saved the claim's template on its PV");
        Ok(text)
    }

    /// Step 2's start: an Event on the claim, then its deletion, conditional on its uid.
    async fn delete_bound_claim(
        &self,
        v: &LocalVolume,
        c: &ClaimRef,
        old: &PersistentVolumeClaim,
        gone: Duration,
    ) -> Result<()> {
        let message = format!(
            "{}; action recreate: deleting this claim to create it again unbound",
            self.message(v, gone)
        );
        self.calls
            .event(&claim_ref(old), "Warning", "NodeLost", &message)
            .await?;
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(c.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let pvc_api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &c.namespace);
        match self
            .calls
            .call(
                format!("delete claim {}/{}", c.namespace, c.name),
                pvc_api.delete(&c.name, &dp),
            )
            .await
        {
            Ok(_) => {}
            Err(Error::Api(_, kube::Error::Api(s))) if s.is_not_found() => {}
            Err(e) => return Err(e),
        }
        warn!(pv = %v.pv_name, node = %v.node, claim = %format!("{}/{}", c.namespace, c.name),
            "node lost: deleted the claim bound to its volume");
        Ok(())
    }

    /// Step 2's end: the deleted claim gone. Its pvc-protection finalizer is removed once
    /// no pod uses it; Done once the claim is gone, else what it waits for.
    async fn release_deleted_claim(&self, v: &LocalVolume, c: &ClaimRef) -> Result<Progress> {
        // Deleted at once unless a finalizer holds it.
        let Some(old) = self.bound_claim(v).await? else {
            return Ok(Progress::Done);
        };
        let finalizers = old.metadata.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == PVC_PROTECTION) {
            return Ok(Progress::Waiting(format!(
                "claim {}/{} is held by finalizers {finalizers:?}",
                c.namespace, c.name
            )));
        }
        if let Some(why) = self.pod_using_claim(c).await? {
            return Ok(Progress::Waiting(why));
        }
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != PVC_PROTECTION).collect();
        // resourceVersion makes the patch conditional: a claim changed since the read
        // (a pod added, a finalizer) is a conflict, retried next pass.
        let patch = json!({"metadata": {
            "resourceVersion": old.metadata.resource_version,
            "finalizers": rest,
        }});
        let pvc_api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &c.namespace);
        self.calls
            .call(
                format!(
                    "remove {PVC_PROTECTION} from claim {}/{}",
                    c.namespace, c.name
                ),
                pvc_api.patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
        info!(claim = %format!("{}/{}", c.namespace, c.name), "no pod uses the deleted claim: removed its {PVC_PROTECTION} finalizer");
        if self.bound_claim(v).await?.is_some() {
            return Ok(Progress::Waiting(format!(
                "claim {}/{} is still being deleted",
                c.namespace, c.name
            )));
        }
        Ok(Progress::Done)
    }

    /// What a pod still using claim `c` keeps it waiting for; None when no pod uses it.
    async fn pod_using_claim(&self, c: &ClaimRef) -> Result<Option<String>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &c.namespace);
        let pods = self
            .calls
            .call(
                format!("list pods in {}", c.namespace),
                pods.list(&ListParams::default()),
            )
            .await?;
        Ok(pods.items.iter().find(|p| pod_uses_claim(p, &c.name)).map(|p| {
            format!(
                "pod {}/{} (node {}) still uses claim {}; the pod garbage collector removes pods of deleted nodes",
                c.namespace,
                p.metadata.name.as_deref().unwrap_or(""),
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or(""),
                c.name
            )
        }))
    }

    fn template_annotation(&self) -> String {
        format!("{}/node-loss-claim", self.cfg.selector.driver)
    }

    async fn recreate_claim_and_delete_pv(
        &mut self,
        v: &LocalVolume,
        saved: Option<&str>,
    ) -> Result<Progress> {
        match (saved, &v.claim) {
            (Some(text), Some(c)) => {
                if let Progress::Waiting(why) = self.recreate_claim(v, c, text).await? {
                    return Ok(Progress::Waiting(why));
                }
            }
            (None, Some(c)) => {
                info!(pv = %v.pv_name, claim = %format!("{}/{}", c.namespace, c.name),
                    "the PV's claim is gone or replaced already: deleting the PV only");
            }
            _ => info!(pv = %v.pv_name, "PV bound to no claim: deleting it"),
        }
        self.delete_pv(v).await?;
        Ok(Progress::Done)
    }

    /// Step 3: claim `c` created again, unbound, from its saved template `text`; Waiting
    /// when the template does not parse, which only a person can sort out.
    async fn recreate_claim(&self, v: &LocalVolume, c: &ClaimRef, text: &str) -> Result<Progress> {
        let new: PersistentVolumeClaim = match serde_json::from_str(text) {
            Ok(t) => t,
            Err(e) => {
                return Ok(Progress::Waiting(format!(
                    "the saved claim on PV {} does not parse ({e}); re-create {}/{} by hand and delete the PV",
                    v.pv_name, c.namespace, c.name
                )))
            }
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        match self
            .calls
            .call(
                format!("create claim {}/{}", c.namespace, c.name),
                api.create(&PostParams::default(), &new),
            )
            .await
        {
            Ok(created) => {
                let message = format!(
                    "re-created unbound: its volume {} was on node {}, deleted for good",
                    v.pv_name, v.node
                );
                self.calls
                    .event(
                        &claim_ref(&created),
                        "Normal",
                        "NodeLostRecreated",
                        &message,
                    )
                    .await?;
                warn!(claim = %format!("{}/{}", c.namespace, c.name), pv = %v.pv_name, node = %v.node,
                    "node lost: re-created the claim unbound");
                self.metrics
                    .recreated
                    .get_or_create(&NodeLabel {
                        node: v.node.clone(),
                    })
                    .inc();
            }
            // Already re-created (by an earlier pass, or a StatefulSet for its pod).
            Err(Error::Api(_, kube::Error::Api(s))) if s.is_already_exists() => {
                info!(claim = %format!("{}/{}", c.namespace, c.name), "a claim of that name exists already: not created again");
            }
            Err(e) => return Err(e),
        }
        Ok(Progress::Done)
    }

    async fn delete_pv(&self, v: &LocalVolume) -> Result<()> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(v.pv_uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self
            .calls
            .call(
                format!("delete pv {}", v.pv_name),
                api.delete(&v.pv_name, &dp),
            )
            .await
        {
            Ok(_) => {}
            Err(Error::Api(_, kube::Error::Api(s))) if s.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        }
        let Some(pv) = self
            .calls
            .call(format!("get pv {}", v.pv_name), api.get_opt(&v.pv_name))
            .await?
        else {
            warn!(pv = %v.pv_name, node = %v.node, "node lost: deleted the PV");
            return Ok(());
        };
        let finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
        let (ours, others): (Vec<String>, Vec<String>) = finalizers
            .into_iter()
            .partition(|f| PV_FINALIZERS.contains(&f.as_str()));
        if !ours.is_empty() {
            let patch = json!({"metadata": {
                "resourceVersion": pv.metadata.resource_version,
                "finalizers": others,
            }});
            self.calls
                .call(
                    format!("remove finalizers {ours:?} from pv {}", v.pv_name),
                    api.patch(&v.pv_name, &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await?;
        }
        if others.is_empty() {
            warn!(pv = %v.pv_name, node = %v.node, removed_finalizers = ?ours, "node lost: deleted the PV");
        } else if others == [PROVISIONER_FINALIZER] {
            warn!(pv = %v.pv_name, node = %v.node, removed_finalizers = ?ours,
                "node lost: deleted the PV; it stays until the node's provisioner frees its volume \
                 (DeleteVolume) should the node come back; if it never will, remove the finalizer \
                 {PROVISIONER_FINALIZER}");
        } else {
            warn!(pv = %v.pv_name, waiting_for = ?others, "PV deleted; other finalizers hold it");
        }
        Ok(())
    }
}

/// A PV this controller deleted in an earlier pass (it bears the claim's template, saved
/// before anything else, and is deleted only once the claim is re-created), held only by
/// the provisioner's finalizer: the rest is the node's, should it return. A PV someone
/// else deleted goes through every step as before.
fn awaits_its_node(pv: &PersistentVolume, template_key: &str) -> bool {
    let saved = pv.metadata.annotations.as_ref();
    pv.metadata.deletion_timestamp.is_some()
        && saved.is_some_and(|a| a.contains_key(template_key))
        && pv.metadata.finalizers.as_deref() == Some(&[PROVISIONER_FINALIZER.to_owned()][..])
}

fn claim_ref(pvc: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: pvc.metadata.name.clone(),
        namespace: pvc.metadata.namespace.clone(),
        uid: pvc.metadata.uid.clone(),
        resource_version: pvc.metadata.resource_version.clone(),
        ..Default::default()
    }
}

fn pv_ref(v: &LocalVolume) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolume".into()),
        name: Some(v.pv_name.clone()),
        uid: Some(v.pv_uid.clone()),
        ..Default::default()
    }
}

impl gds_csi_kube::Passes for Controller {
    async fn pass(&mut self) -> Result<()> {
        self.pass_counted().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const KEY: &str = "gds.csi.gds-csi.io/node-loss-claim";

    fn pv(deleted: bool, template: bool, finalizers: &[&str]) -> PersistentVolume {
        let mut pv = PersistentVolume::default();
        let m = &mut pv.metadata;
        m.deletion_timestamp = deleted.then(|| Time(k8s_openapi::jiff::Timestamp::now()));
        m.annotations = template.then(|| [(KEY.to_owned(), "{}".to_owned())].into());
        m.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        pv
    }

    #[test]
    fn only_a_pv_this_controller_deleted_and_only_the_provisioner_holds_awaits_its_node() {
        assert!(awaits_its_node(
            &pv(true, true, &[PROVISIONER_FINALIZER]),
            KEY
        ));
        // Deleted by someone else (no saved template): every step runs as before.
        assert!(!awaits_its_node(
            &pv(true, false, &[PROVISIONER_FINALIZER]),
            KEY
        ));
        assert!(!awaits_its_node(
            &pv(false, true, &[PROVISIONER_FINALIZER]),
            KEY
        ));
        let both = [PROVISIONER_FINALIZER, "kubernetes.io/pv-protection"];
        assert!(!awaits_its_node(&pv(true, true, &both), KEY));
        assert!(!awaits_its_node(&pv(true, true, &[]), KEY));
    }
}
