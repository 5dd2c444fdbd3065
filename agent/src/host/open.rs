//! Restart: the lease table is loaded from the store, and every live lease is
//! re-adopted only if its pid still names the same process (pid *and* start time),
//! since the kernel may have given the pid to something else while the agent was
//! away; ladders cut short by the stop run again.

use super::{Drain, Host, HostError, Settings, CLUSTER, ENDED_SHOWN, HOLD_KEY, LOCAL};
use crate::lease::LeaseEnd;
use crate::lease::LeaseState;
use crate::os::Os;
use crate::store::{Store, StoreError};
use std::collections::{BTreeMap, BTreeSet};

impl Host {
    /// Loads the lease table and re-adopts what still runs: a lease whose pid now
    /// names another process (or none) ended while the agent was away.
    pub fn open(
        store: Store,
        settings: Settings,
        os: Box<dyn Os>,
        now_ms: i64,
    ) -> Result<Host, HostError> {
        let load = |key: &str| -> Result<Option<Drain>, StoreError> {
            Ok(store.get_json::<Drain>(key)?.map(|mut d| {
                if d.by.is_empty() {
                    // A row without its author kind: the key says whose it is.
                    d.by = if key == "cluster-drain" {
                        CLUSTER
                    } else {
                        LOCAL
                    }
                    .into();
                }
                d.migrate()
            }))
        };
        let mut local_drain = load("drain")?;
        let mut cluster_drain = load("cluster-drain")?;
        if local_drain.as_ref().is_some_and(|d| d.by == CLUSTER) {
            // 0.1.0 kept allotd's drain under the host operator's key: move it, so that
            // allotd's undrain lifts it for good.
            cluster_drain = local_drain.take();
            let v = cluster_drain
                .as_ref()
                .map(|d| serde_json::to_string(d).unwrap_or_default());
            store.set("cluster-drain", v.as_deref())?;
            store.set("drain", None)?;
        }
        let mut h = Host {
            os,
            leases: BTreeMap::new(),
            owned: BTreeSet::new(),
            settings,
            inventory: Vec::new(),
            verdict: None,
            faults: Default::default(),
            local_drain,
            cluster_drain,
            health_drain: None,
            defer_health: false,
            allotd_hold: store.get_json::<String>(HOLD_KEY)?,
            held_gpus: BTreeSet::new(),
            changed: std::sync::Mutex::new(Vec::new()),
            failed_write: std::sync::Mutex::new(None),
            check_disk: false,
            low_since: BTreeMap::new(),
            use_said: BTreeMap::new(),
            store,
        };
        if let Err(e) = h.store.prune_events(now_ms) {
            tracing::warn!(error = %e, "cannot prune old events");
        }
        for mut l in h.store.leases(ENDED_SHOWN)? {
            let read = l.clone();
            if l.live() {
                if l.pid <= 0 {
                    l.end(now_ms, LeaseEnd::FailedToStart, "");
                    h.note(
                        "lease",
                        &l.id,
                        "",
                        "the agent stopped while starting it; never ran",
                    );
                } else if !h.still_running(&l) {
                    let msg = if l.state == LeaseState::Checkpointing {
                        h.end_cut_ladder(&mut l, now_ms)
                    } else {
                        h.end_unreaped(&mut l, now_ms, true)
                    };
                    h.note("lease", &l.id, "", &msg);
                } else {
                    if l.state == LeaseState::Checkpointing {
                        // The ladder was cut short with the old agent: run it again.
                        l.state = LeaseState::Revoking;
                        l.not_before_ms = Some(now_ms);
                    }
                    h.note(
                        "lease",
                        &l.id,
                        "",
                        &format!(
                            "re-adopted pid {} ({}), timers resume",
                            l.pid,
                            l.state.as_str()
                        ),
                    );
                }
                // Only a change is written; one that cannot be (a full disk) drains
                // the host rather than stop it: the leases it runs are in memory.
                if l != read {
                    if let Err(e) = h.store.put_lease(&l) {
                        h.write_failed(&e.to_string(), now_ms);
                    }
                }
            }
            h.leases.insert(l.id.clone(), l);
        }
        Ok(h)
    }
}
