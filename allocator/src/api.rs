//! The gRPC services of allotd: `Workloads`, `Org`, `Nodes` for people (through
//! the `allot` CLI) and `AgentStream` for agents. Requests are checked here and
//! answered with the field at fault and the fix; every change goes through
//! [`Server::commit`].

use crate::limits::MAX_HOST_GPUS;
use crate::serve::{now, Server};
use crate::state::{
    lease_from_wire, lease_wire, ArraySpec, Ask, Denied, Dep, DepKind, Gates, HoldRec, Input, Out,
    TimeWarning, Who,
};
use crate::wire::{
    command_pb, end_from_agent, end_from_agent_text, gpu_report, gpu_seen, host_drain, node_pb,
    state_pb, tree_pb, verdict_of, workload_pb,
};
use allot_common::drain::DrainAuthor;
use allot_fairshare::{CoreError, NodeSpec, NodeState, SpecError, WorkloadSpec, WorkloadState};
use allot_proto::v1 as pb;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

fn core_status(e: CoreError) -> Status {
    match e {
        CoreError::UnknownProject(_)
        | CoreError::Impossible { .. }
        | CoreError::UnknownGroup(_) => Status::invalid_argument(e.to_string()),
        CoreError::UnknownWorkload(_) | CoreError::UnknownLease(_) | CoreError::UnknownNode(_) => {
            Status::not_found(e.to_string())
        }
        CoreError::AlreadyEnded(_) | CoreError::NotRunning(_) | CoreError::Running(_) => {
            Status::failed_precondition(e.to_string())
        }
        _ => Status::invalid_argument(e.to_string()),
    }
}

/// The services, sharing one [`Server`].
#[derive(Clone)]
pub struct Api(pub Arc<Server>);

/// Who a web session proved (its login's token), carried into the API's own
/// handlers so a page sees and may do exactly what the same user's CLI may.
#[derive(Debug, Clone)]
pub(crate) struct WebWho(pub Who);

/// The header an enrolled node's agent sets to vouch for its local user.
pub const VOUCH_HEADER: &str = "x-allot-user";

fn denied_status(d: Denied) -> Status {
    if d.unauthenticated {
        Status::unauthenticated(d.message)
    } else {
        Status::permission_denied(d.message)
    }
}

/// Who the request layer found a request to be (`grpc`'s prover): the handlers
/// take it as found, rather than prove it again.
#[derive(Debug, Clone)]
struct Proven(Who);

/// Who is asking, from what the transport proved: the peer's certificate (an
/// enrolled node, maybe vouching for a user), a bearer token, or the admin socket.
/// A credential that is shown but not valid is refused, never taken as anonymous.
pub fn who_of<T>(server: &Server, req: &Request<T>) -> Result<Who, Status> {
    // A page of allotd's own HTTP listener calls in for its session's user; only
    // allotd's code can put this in a request's extensions.
    if let Some(WebWho(who)) = req.extensions().get::<WebWho>() {
        return Ok(who.clone());
    }
    if let Some(Proven(who)) = req.extensions().get::<Proven>() {
        return Ok(who.clone());
    }
    who_from(server, req.extensions(), req.metadata().as_ref())
}

/// Who a request's transport (`ext`) and headers prove, before its body is read.
fn who_from(
    server: &Server,
    ext: &http::Extensions,
    headers: &http::HeaderMap,
) -> Result<Who, Status> {
    // Only the admin socket is a unix socket, and it admits root and allotd's user.
    if ext
        .get::<tonic::transport::server::UdsConnectInfo>()
        .is_some()
    {
        return Ok(Who::Local);
    }
    let now = now();
    if let Some(cert) = crate::conns::peer_certs(ext).and_then(|c| c.first().cloned()) {
        let info = allot_auth::CertInfo::from_der(&cert)
            .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?;
        server
            .core()
            .alloc
            .creds
            .node_may_connect(&info.common_name, &info.fingerprint, now)
            .map_err(|r| Status::permission_denied(r.0))?;
        return Ok(match headers.get(VOUCH_HEADER) {
            Some(u) => {
                let user = u
                    .to_str()
                    .map_err(|_| Status::invalid_argument(format!("{VOUCH_HEADER}: not text")))?;
                safe_name(VOUCH_HEADER, user)?;
                Who::Vouched {
                    user: user.to_string(),
                    node: info.common_name,
                }
            }
            None => Who::Node(info.common_name),
        });
    }
    if let Some(v) = headers.get("authorization") {
        let secret = v
            .to_str()
            .ok()
            .and_then(|s| s.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("authorization: expected `Bearer TOKEN`"))?;
        let user = server
            .core()
            .alloc
            .token_user(secret, now)
            .map_err(|r| Status::unauthenticated(r.0))?;
        return Ok(Who::User(user));
    }
    Ok(Who::Anonymous)
}

/// What a gRPC request proves, at its headers: its caller, left in its
/// extensions for the handler; a credential that is not valid, and an anonymous
/// call of anything but what anyone may call (`state::anonymous_may`), refused
/// there and then, so that no request without a credential waits for its body.
fn prove(server: &Server, parts: &mut http::request::Parts) -> crate::conns::Proof {
    use crate::conns::Proof;
    let open = crate::state::anonymous_may(parts.uri.path());
    match who_from(server, &parts.extensions, &parts.headers) {
        // Enroll's one-time token is its credential, whatever else the caller
        // carries (a revoked node enrolling again).
        Err(_) | Ok(Who::Anonymous) if open => Proof::Anonymous,
        Err(status) => Proof::Refused(status),
        Ok(Who::Anonymous) => match server.core().alloc.authorize(&Who::Anonymous, Ask::Read) {
            Err(d) => Proof::Refused(denied_status(d)),
            Ok(()) => Proof::Anonymous,
        },
        Ok(who) => {
            let identity = who.connection_identity();
            parts.extensions.insert(Proven(who));
            Proof::Identity(identity)
        }
    }
}

/// A name as identities and credentials carry it (the safe set, capped).
pub(crate) fn safe_name(field: &str, s: &str) -> Result<(), Status> {
    crate::limits::node(field, s)
}

impl Api {
    /// Who is asking.
    pub(crate) fn who<T>(&self, req: &Request<T>) -> Result<Who, Status> {
        who_of(&self.0, req)
    }

    /// Whether `who` may `ask` (the state machine's rule).
    pub(crate) fn check(&self, who: &Who, ask: Ask<'_>) -> Result<(), Status> {
        self.0
            .core()
            .alloc
            .authorize(who, ask)
            .map_err(denied_status)
    }

    /// Who is asking, if they may `ask`.
    pub(crate) fn allow<T>(&self, req: &Request<T>, ask: Ask<'_>) -> Result<Who, Status> {
        let who = self.who(req)?;
        self.check(&who, ask)?;
        Ok(who)
    }

    fn node_view(&self, name: &str) -> Option<pb::Node> {
        let c = self.0.core();
        let n = c.alloc.nodes().get(name)?;
        let leases = c.alloc.leases_on(name);
        let core = c.alloc.core.cluster().node(n.id);
        let mut v = node_pb(n, &leases, core.free().count_ones(), now());
        v.leaving_lease_ids = c
            .alloc
            .leaving_on(name)
            .into_iter()
            .map(lease_wire)
            .collect();
        v.refused_gpus = if core.refused_from == u32::MAX {
            0
        } else {
            core.refused_from
        };
        Some(v)
    }

    fn workload_view(&self, id: u64) -> Result<pb::Workload, Status> {
        let c = self.0.core();
        c.alloc
            .workloads()
            .get(&id)
            .map(|w| workload_pb(w, c.alloc.why(now(), id)))
            .ok_or_else(|| {
                Status::not_found(format!("no workload {id}; `allot queue --all` lists them"))
            })
    }
}

impl Api {
    /// The workloads an id names: a workload; an array's id, every element of it
    /// not ended (`pending_only`: not running either); `ARRAY_INDEX`, one element.
    /// The first of the pair is the id as named (the array's own for a whole array).
    fn targets(&self, text: &str, pending_only: bool) -> Result<(u64, Vec<u64>), Status> {
        let c = self.0.core();
        let work = c.alloc.workloads();
        if let Some((a, i)) = text.trim().split_once('_') {
            let array = parse_id(a)?;
            let index: u32 = i.parse().map_err(|_| {
                Status::invalid_argument(format!(
                    "id: {i:?} is not an array index; write ARRAY_INDEX, as 12_3"
                ))
            })?;
            let found = c.alloc.array_element(array, index).ok_or_else(|| {
                Status::not_found(format!(
                    "no element {index} in array {array}; `allot queue` lists them"
                ))
            })?;
            return Ok((found, vec![found]));
        }
        let id = parse_id(text)?;
        let is_array = work
            .get(&id)
            .and_then(|w| w.array)
            .is_some_and(|p| p.id == id);
        if !is_array {
            return Ok((id, vec![id]));
        }
        let ids = c
            .alloc
            .array_elements(id)
            .into_iter()
            .filter(|e| {
                work.get(e).is_some_and(|w| {
                    w.state == WorkloadState::Pending
                        || (!pending_only && w.state == WorkloadState::Running)
                })
            })
            .collect();
        Ok((id, ids))
    }

    /// The one workload `text` names: an id, or `ARRAY_INDEX` (an array's id alone
    /// names its first element, as a workload).
    fn one(&self, text: &str) -> Result<u64, Status> {
        if text.contains('_') {
            Ok(self.targets(text, false)?.0)
        } else {
            parse_id(text)
        }
    }

    /// Hold, release, requeue or update what `text` names, each with `who`'s right
    /// checked first; one refusal refuses the whole request before anything changes.
    fn control(
        &self,
        text: &str,
        who: &Who,
        verb: &'static str,
        operator_only: bool,
        input: impl Fn(u64) -> Input,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let pending_only = verb != "requeue";
        let (id, ids) = self.targets(text, pending_only)?;
        if ids.is_empty() {
            return Err(Status::failed_precondition(format!(
                "array {id} has no element left to {verb}"
            )));
        }
        for &one in &ids {
            self.check(
                who,
                Ask::Control {
                    id: one,
                    verb,
                    operator_only,
                },
            )?;
        }
        let mut out = Vec::with_capacity(ids.len());
        for one in ids {
            self.0.commit(input(one)).map_err(core_status)?;
            out.push(self.workload_view(one)?);
        }
        Ok(Response::new(pb::ControlResponse { workloads: out }))
    }

    /// The gates and the array of a submission, checked: dependencies on workloads
    /// allotd knows (an array's id stands for all its elements), a begin time, a
    /// well-formed array.
    fn gates_of(
        &self,
        s: &pb::WorkloadSpec,
        who: &Who,
    ) -> Result<(Gates, Option<ArraySpec>), Status> {
        const MAX_DEPS: usize = allot_common::array::MAX_ELEMENTS;
        if s.dependencies.len() > MAX_DEPS {
            return Err(Status::invalid_argument(format!(
                "dependencies: more than {MAX_DEPS}; depend on fewer"
            )));
        }
        let mut deps = Vec::new();
        {
            let c = self.0.core();
            for (i, d) in s.dependencies.iter().enumerate() {
                let kind = DepKind::parse(&d.kind).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "dependencies[{i}].kind: {:?} is not a dependency; use after, afterany, afterok or afternotok",
                        d.kind
                    ))
                })?;
                // Work the caller may not see is not there for them: a dependency
                // must not tell whether another's job exists, or how it ended.
                let unknown = |id: u64| {
                    Status::invalid_argument(format!(
                        "dependencies[{i}].id: no workload {id} (or it ended longer ago than allotd keeps ended work); `allot queue --all` lists them"
                    ))
                };
                let whole_array = !d.id.contains('_');
                let id = match d.id.split_once('_') {
                    // One element of an array: ARRAY_INDEX.
                    Some((arr, index)) => {
                        let arr = parse_id(arr)?;
                        if !c.alloc.sees(who, arr) {
                            return Err(unknown(arr));
                        }
                        let index: u32 = index.parse().map_err(|_| {
                            Status::invalid_argument(format!(
                                "dependencies[{i}].id: {:?} is not ARRAY_INDEX (as 12_3)",
                                d.id
                            ))
                        })?;
                        c.alloc.array_element(arr, index).ok_or_else(|| {
                            Status::invalid_argument(format!(
                                "dependencies[{i}].id: no element {index} in array {arr}"
                            ))
                        })?
                    }
                    None => parse_id(&d.id)?,
                };
                let Some(w) = c
                    .alloc
                    .workloads()
                    .get(&id)
                    .filter(|_| c.alloc.sees(who, id))
                else {
                    return Err(unknown(id));
                };
                let ids = match w.array {
                    Some(p) if p.id == id && whole_array => c.alloc.array_elements(id),
                    _ => vec![id],
                };
                deps.extend(ids.into_iter().map(|id| Dep { kind, id }));
                if deps.len() > MAX_DEPS {
                    return Err(Status::invalid_argument(format!(
                        "dependencies: more than {MAX_DEPS} workloads; depend on fewer"
                    )));
                }
            }
        }
        if s.begin_unix < 0 {
            return Err(Status::invalid_argument(
                "begin_unix: a time before 1970; give a Unix time, or 0 for now",
            ));
        }
        let array = if s.array.is_empty() {
            None
        } else {
            allot_common::fields::check_len("array", &s.array, 1024)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            Some(allot_common::array::parse(&s.array).map_err(Status::invalid_argument)?)
        };
        let hold = s.hold.then(|| HoldRec {
            by: who.name(),
            operator: false,
        });
        Ok((
            Gates {
                hold,
                deps,
                singleton: s.singleton,
                begin: s.begin_unix as u64,
            },
            array,
        ))
    }
}

/// The events a submission asks to hear of: `all`, or each of
/// [`crate::notify::EVENTS`] (each once, in that order).
fn notify_of(s: &pb::WorkloadSpec) -> Result<Vec<String>, Status> {
    use crate::notify::EVENTS;
    let mut out = Vec::new();
    for (i, e) in s.notify.iter().enumerate() {
        let e = e.trim().to_lowercase();
        if e == "all" {
            return Ok(EVENTS.iter().map(|e| e.to_string()).collect());
        }
        if !EVENTS.contains(&e.as_str()) {
            return Err(Status::invalid_argument(format!(
                "notify[{i}]: {e:?} is not an event; use end, fail, preempt, time-limit or all"
            )));
        }
        out.push(e);
    }
    out.sort_by_key(|e| EVENTS.iter().position(|x| x == e));
    out.dedup();
    Ok(out)
}

fn parse_id(s: &str) -> Result<u64, Status> {
    crate::limits::id("id", s)?;
    s.trim().parse().map_err(|_| {
        Status::invalid_argument(format!(
            "id: {s:?} is not a workload id (a number, as `allot queue` shows)"
        ))
    })
}

/// The core's spec of a submission: its class (the default when it names none)
/// and that class's contract where the submission leaves it out, checked by
/// [`WorkloadSpec::check`]; a refusal says where each number came from.
fn workload_spec(
    s: &pb::WorkloadSpec,
    classes: &std::collections::BTreeMap<String, crate::config::ClassDefaults>,
) -> Result<WorkloadSpec, Status> {
    let class = if s.class.is_empty() {
        allot_fairshare::DEFAULT_CLASS
    } else {
        &s.class
    };
    let d = classes.get(class).cloned().unwrap_or_default();
    let spec = WorkloadSpec {
        project: s.project.clone(),
        user: s.user.clone(),
        class: class.to_string(),
        gpus_per_node: s.gpus_per_node,
        nodes: s.nodes,
        cpu_per_node: s.cpu_per_node,
        mem_per_node_gb: s.mem_per_node_gb,
        min_runtime: s.min_runtime_s.or(d.min_runtime).unwrap_or(0),
        time_limit: s.time_limit_s.or(d.time_limit),
        resumable: s.resumable,
        priority: s.priority,
        no_requeue: s.no_requeue,
        select: allot_fairshare::select::Select {
            gpu_types: s
                .gpu_types
                .iter()
                .map(|t| t.trim().to_lowercase())
                .collect(),
            features: s.constraint.clone(),
            cluster: s.cluster.clone(),
            nodelist: s.nodelist.clone(),
            exclude: s.exclude.clone(),
        },
    };
    if !s.warn_signal.is_empty() && spec.time_limit.is_none() {
        return Err(Status::invalid_argument(format!(
            "warn_signal: a warning before the time limit needs a time limit, and class {} has none; add --time-limit, or drop --signal",
            spec.class
        )));
    }
    if let Some(limit) = spec
        .time_limit
        .filter(|l| !s.warn_signal.is_empty() && s.warn_before_s >= *l)
    {
        return Err(Status::invalid_argument(format!(
            "warn_before_s: {} s before a time limit of {limit} s ({}) is at or before the start: the warning would come as the work starts; warn less long before the limit (--signal {}@{}s), or give a longer --time-limit",
            s.warn_before_s,
            if s.time_limit_s.is_some() {
                "asked for"
            } else {
                "the class's default"
            },
            s.warn_signal,
            limit / 2,
        )));
    }
    match spec.check() {
        Ok(()) => Ok(spec),
        Err(SpecError::ProtectedPastLimit {
            min_runtime,
            time_limit,
        }) => {
            let from = |asked: bool| {
                if asked {
                    "asked for"
                } else {
                    "the class's default"
                }
            };
            Err(Status::invalid_argument(format!(
                "min_runtime = {min_runtime} ({}): longer than time_limit ({time_limit} s, {}): the work would be stopped before its protection ends; ask for a min runtime no longer than the time limit",
                from(s.min_runtime_s.is_some()),
                from(s.time_limit_s.is_some()),
            )))
        }
        Err(e) => Err(Status::invalid_argument(e.to_string())),
    }
}

fn check_spec(s: &pb::WorkloadSpec) -> Result<(), Status> {
    let bad = |field: &str, why: String| Err(Status::invalid_argument(format!("{field}: {why}")));
    if s.project.trim().is_empty() {
        return bad(
            "project",
            "required; `allot share` lists the projects".into(),
        );
    }
    crate::limits::spec(s)?;
    if s.script.is_empty() && (s.argv.is_empty() || s.argv[0].is_empty()) {
        return bad(
            "argv",
            "the command to run is missing (after `--`, or a batch script)".into(),
        );
    }
    if s.pty && (s.nodes > 1 || !s.array.is_empty() || !s.script.is_empty()) {
        return bad(
            "pty",
            "a session's terminal is one program on one node: give --pty without --nodes, --array or a batch script".into(),
        );
    }
    if !s.script.is_empty() && !s.script.starts_with("#!") {
        return bad(
            "script",
            "a batch script starts with a #! line naming its interpreter (#!/bin/bash), as sbatch asks".into(),
        );
    }
    if !s.checkpoint_hook.is_empty() {
        s.checkpoint_hook
            .parse::<allot_checkpoint_hooks::Hook>()
            .map_err(|e| Status::invalid_argument(format!("checkpoint_hook: {e}")))?;
    }
    if s.user.trim().is_empty() {
        return bad("user", "required (the CLI sends $USER)".into());
    }
    if !s.warn_signal.is_empty() {
        format!("signal:{}", s.warn_signal)
            .parse::<allot_checkpoint_hooks::Hook>()
            .map_err(|e| {
                Status::invalid_argument(format!(
                    "warn_signal: {:?} is not a signal a program can catch ({}); use e.g. USR2",
                    s.warn_signal, e.why
                ))
            })?;
        if s.warn_before_s > allot_fairshare::scheduler::MAX_CONTRACT {
            return bad(
                "warn_before_s",
                format!(
                    "{} s is longer than the longest contract (365d)",
                    s.warn_before_s
                ),
            );
        }
    } else if s.warn_before_s != 0 {
        return bad(
            "warn_signal",
            "warn_before_s is set without a signal; give both (--signal USR2@5m)".into(),
        );
    }
    Ok(())
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl pb::workloads_server::Workloads for Api {
    async fn submit(
        &self,
        req: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let who = self.who(&req)?;
        let mut s = req
            .into_inner()
            .spec
            .ok_or_else(|| Status::invalid_argument("spec: missing"))?;
        // Who asks is settled before what they ask is read.
        self.check(&who, Ask::Read)?;
        // The work runs as whoever is proven to ask; a different name is refused.
        if s.user.is_empty() {
            s.user = who.user().unwrap_or_default().to_string();
        }
        // No project named: the only one the user is a member of, if just one.
        if s.project.is_empty() && !s.user.is_empty() {
            let mine = self.0.core().alloc.member_projects(&s.user);
            match mine.as_slice() {
                [only] => s.project = only.clone(),
                [] => {
                    return Err(Status::invalid_argument(format!(
                        "project: required; {} is a member of no project; `allot share` lists them (set --project, $ALLOT_PROJECT, or project = \"P\" in ~/.config/allot/config.toml)",
                        s.user
                    )))
                }
                many => {
                    return Err(Status::invalid_argument(format!(
                        "project: required; {} is a member of {}: say which (--project, $ALLOT_PROJECT, or project = \"P\" in ~/.config/allot/config.toml)",
                        s.user,
                        many.join(", ")
                    )))
                }
            }
        }
        check_spec(&s)?;
        self.check(
            &who,
            Ask::Submit {
                project: &s.project,
                user: &s.user,
            },
        )?;
        let spec = workload_spec(&s, &self.0.cfg.classes)?;
        let (gates, array) = self.gates_of(&s, &who)?;
        let input = Input::Submit {
            spec,
            argv: s.argv.clone(),
            hook: s.checkpoint_hook.clone(),
            cwd: s.cwd.clone(),
            env: s
                .env
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect(),
            output: s.output.clone(),
            error: s.error.clone(),
            warn: (!s.warn_signal.is_empty()).then(|| TimeWarning {
                // One spelling kept and shown: the name without its SIG prefix.
                signal: allot_checkpoint_hooks::signal_named(&s.warn_signal)
                    .map(|sig| sig.as_str().trim_start_matches("SIG").to_string())
                    .unwrap_or_else(|| s.warn_signal.clone()),
                before_s: s.warn_before_s,
            }),
            name: s.name.clone(),
            gates,
            array,
            script: s.script.clone(),
            notify: notify_of(&s)?,
            pty: s.pty,
        };
        let a = self.0.commit(input).map_err(core_status)?;
        let workload = a.id.and_then(|id| self.workload_view(id).ok());
        Ok(Response::new(pb::SubmitResponse {
            id: a.id.map(|i| i.to_string()).unwrap_or_default(),
            workload,
        }))
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::Workload>, Status> {
        let (id, ids) = self.targets(&req.get_ref().id, false)?;
        let who = self.who(&req)?;
        for &one in &ids {
            self.check(&who, Ask::Cancel(one))?;
        }
        for one in ids {
            match self.0.commit(Input::Cancel {
                id: one,
                by: who.name(),
            }) {
                // An array's elements end by themselves meanwhile: the rest go on.
                Err(CoreError::AlreadyEnded(_)) if one != id => {}
                r => {
                    r.map_err(core_status)?;
                }
            }
        }
        Ok(Response::new(self.workload_view(id)?))
    }

    async fn history(
        &self,
        req: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        let who = self.allow(&req, Ask::Read)?;
        crate::limits::history(req.get_ref())?;
        let server = self.0.clone();
        let r = req.into_inner();
        // The store is read under the state's lock: off the async workers.
        tokio::task::spawn_blocking(move || crate::reports::history(&server, &who, &r))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map(Response::new)
    }

    async fn hold(
        &self,
        req: Request<pb::ControlRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let who = self.who(&req)?;
        let operator = self.0.core().alloc.is_operator(&who);
        self.control(&req.get_ref().id, &who, "hold", false, |id| Input::Hold {
            id,
            by: who.name(),
            operator,
        })
    }

    async fn release(
        &self,
        req: Request<pb::ControlRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let who = self.who(&req)?;
        // An operator's hold is an operator's to release.
        let (_, ids) = self.targets(&req.get_ref().id, true)?;
        let operators_hold = {
            let c = self.0.core();
            ids.iter().any(|i| {
                c.alloc
                    .workloads()
                    .get(i)
                    .and_then(|w| w.gates.hold.as_ref())
                    .is_some_and(|h| h.operator)
            })
        };
        self.control(
            &req.get_ref().id,
            &who,
            if operators_hold {
                "release an operator's hold on"
            } else {
                "release"
            },
            operators_hold,
            |id| Input::Release { id, by: who.name() },
        )
    }

    async fn requeue(
        &self,
        req: Request<pb::ControlRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let who = self.who(&req)?;
        let operator = self.0.core().alloc.is_operator(&who);
        let hold = req.get_ref().hold;
        self.control(&req.get_ref().id, &who, "requeue", false, |id| {
            Input::Requeue {
                id,
                by: who.name(),
                hold,
                operator,
            }
        })
    }

    async fn update(
        &self,
        req: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let who = self.who(&req)?;
        let r = req.get_ref();
        if r.time_limit_s.is_none() && r.priority.is_none() && r.begin_unix.is_none() {
            return Err(Status::invalid_argument(
                "update: nothing to change; give --time-limit, --priority or --begin",
            ));
        }
        if r.time_limit_s
            .is_some_and(|t| t == 0 || t > allot_fairshare::scheduler::MAX_CONTRACT)
        {
            return Err(Status::invalid_argument(
                "time_limit_s: give 1 s to 365 days",
            ));
        }
        let begin = match r.begin_unix {
            Some(b) if b < 0 => {
                return Err(Status::invalid_argument(
                    "begin_unix: a time before 1970; give a Unix time, or 0 for now",
                ))
            }
            b => b.map(|b| b as u64),
        };
        // A user may only shorten and lower; anything else is an operator's.
        let (_, ids) = self.targets(&r.id, true)?;
        let beyond = {
            let c = self.0.core();
            ids.iter().any(|i| {
                c.alloc.workloads().get(i).is_some_and(|w| {
                    r.time_limit_s
                        .is_some_and(|t| w.spec.time_limit.is_some_and(|old| t > old))
                        || r.priority.is_some_and(|p| p > w.spec.priority)
                })
            })
        };
        let verb = if beyond {
            "lengthen the time limit or raise the priority of"
        } else {
            "update"
        };
        self.control(&r.id, &who, verb, beyond, |id| Input::Update {
            id,
            by: who.name(),
            time_limit: r.time_limit_s,
            priority: r.priority,
            begin,
        })
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::Workload>, Status> {
        let id = self.one(&req.get_ref().id)?;
        let who = self.allow(&req, Ask::See(id))?;
        let mut w = match self.workload_view(id) {
            Err(e) if e.code() == tonic::Code::NotFound => {
                // Ended long enough ago to have left memory: its record on disk.
                let c = self.0.core();
                let rec = c
                    .retired(id)
                    .map_err(|e| Status::internal(format!("{e:#}")))?
                    .ok_or(e)?;
                c.alloc
                    .authorize_on(&who, Ask::See(id), &rec)
                    .map_err(denied_status)?;
                workload_pb(&rec, (String::new(), ""))
            }
            r => r?,
        };
        self.0.forecasts.fill(&mut w, id);
        // Why it started where it did, why it was revoked: the audit log's lines.
        w.history = self
            .0
            .core()
            .audit_of(id, 100)
            .map_err(|e| Status::internal(e.to_string()))?
            .into_iter()
            .map(|(at, text)| format!("{at} {text}"))
            .collect();
        Ok(Response::new(w))
    }

    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let who = self.allow(&req, Ask::Read)?;
        let r = req.into_inner();
        crate::limits::list(&r)?;
        let at = now();
        let c = self.0.core();
        if !r.project.is_empty()
            && !c
                .alloc
                .core
                .tree()
                .find(&r.project)
                .is_some_and(|g| c.alloc.core.tree().is_project(g))
        {
            return Err(Status::not_found(format!(
                "project: {:?} is not a project of the org tree; `allot share` lists them",
                r.project
            )));
        }
        let workloads = c
            .alloc
            .workloads()
            .values()
            .filter(|w| r.project.is_empty() || w.spec.project == r.project)
            .filter(|w| r.user.is_empty() || w.spec.user == r.user)
            .filter(|w| r.name.is_empty() || w.name == r.name)
            .filter(|w| r.state == 0 || state_pb(w.state) as i32 == r.state)
            // Only what this caller may see: their own, their subtree's, or all.
            .filter(|w| c.alloc.sees(&who, w.id))
            .map(|w| {
                let mut v = workload_pb(w, c.alloc.why(at, w.id));
                self.0.forecasts.fill(&mut v, w.id);
                v
            })
            .collect();
        Ok(Response::new(pb::ListResponse { workloads }))
    }

    type WatchStream = BoxStream<pb::Workload>;

    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let id = self.one(&req.get_ref().id)?;
        let who = self.allow(&req, Ask::See(id))?;
        let first = self.workload_view(id)?;
        let slot = self.0.conns.watch_slot(&who.owner()).map_err(|why| {
            Status::resource_exhausted(format!(
                "watch: {why}; end some `allot watch`, or poll with `allot status`"
            ))
        })?;
        let api = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            // Held while the task runs: the count is of streams still served.
            let _slot = slot;
            let mut last = first;
            if tx.send(Ok(last.clone())).await.is_err() {
                return;
            }
            // Changes are rare and cheap to compare; a poll keeps the state machine
            // free of subscriber bookkeeping. A client that goes away drops the
            // receiver: that ends the task at once, not at the next change (which an
            // unchanged workload never has).
            while last.end_unix == 0 {
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
                }
                let Ok(w) = api.workload_view(id) else { return };
                if w != last {
                    last = w;
                    if tx.send(Ok(last.clone())).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    type AttachStream = crate::attach::AttachStream;

    async fn attach(
        &self,
        req: Request<Streaming<pb::AttachInput>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let who = self.who(&req)?;
        let mut keys = req.into_inner();
        let first = keys.message().await?.ok_or_else(|| {
            Status::invalid_argument("id: the first message names the session's workload")
        })?;
        let id = self.one(&first.id)?;
        self.check(&who, Ask::Attach(id))?;
        Ok(Response::new(crate::attach::open(
            self.0.clone(),
            &who.owner(),
            id,
            first,
            keys,
        )?))
    }

    type LogsStream = BoxStream<pb::LogsChunk>;

    async fn logs(
        &self,
        req: Request<pb::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let id = self.one(&req.get_ref().id)?;
        let who = self.allow(&req, Ask::Logs(id))?;
        let r = req.into_inner();
        let stream = match pb::LogStream::try_from(r.stream) {
            Ok(pb::LogStream::Stderr) => pb::LogStream::Stderr,
            Ok(_) => pb::LogStream::Stdout,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "stream: {} is not an output stream; 1 (stdout) or 2 (stderr)",
                    r.stream
                )))
            }
        };
        let live = self
            .0
            .core()
            .alloc
            .workloads()
            .get(&id)
            .map(|w| w.spec.user.clone());
        let user = match live {
            Some(u) => u,
            None => {
                // Ended long ago: its retired record says whose it is.
                let c = self.0.core();
                let rec = c
                    .retired(id)
                    .map_err(|e| Status::internal(format!("{e:#}")))?
                    .ok_or_else(|| {
                        Status::not_found(format!(
                            "no workload {id}; `allot queue --all` lists them"
                        ))
                    })?;
                c.alloc
                    .authorize_on(&who, Ask::Logs(id), &rec)
                    .map_err(denied_status)?;
                rec.spec.user
            }
        };
        let want = crate::logs::Want {
            id,
            user,
            owner: who.owner(),
            follow: r.follow,
            run: r.run,
            rank: r.rank,
            stream,
        };
        Ok(Response::new(crate::logs::stream(self.0.clone(), want)?))
    }
}

#[tonic::async_trait]
impl pb::org_server::Org for Api {
    async fn usage(
        &self,
        req: Request<pb::UsageRequest>,
    ) -> Result<Response<pb::UsageResponse>, Status> {
        let who = self.allow(&req, Ask::Read)?;
        let server = self.0.clone();
        let r = req.into_inner();
        tokio::task::spawn_blocking(move || crate::reports::usage(&server, &who, &r))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map(Response::new)
    }

    async fn get_tree(
        &self,
        req: Request<pb::GetTreeRequest>,
    ) -> Result<Response<pb::GetTreeResponse>, Status> {
        self.allow(&req, Ask::Read)?;
        Ok(Response::new(tree_pb(self.0.core().alloc.tree(now()))))
    }

    async fn set_weight(
        &self,
        req: Request<pb::SetWeightRequest>,
    ) -> Result<Response<pb::Group>, Status> {
        let who = self.who(&req)?;
        // Who asks is settled first; the name is checked before a refusal echoes it.
        self.check(&who, Ask::Read)?;
        crate::limits::group("name", &req.get_ref().name)?;
        self.check(&who, Ask::SetWeight(&req.get_ref().name))?;
        let r = req.into_inner();
        if !allot_fairshare::tree::weight_ok(r.weight) {
            return Err(Status::invalid_argument(format!(
                "weight: {} is out of range; give a number from {} to {}",
                r.weight,
                allot_fairshare::tree::MIN_WEIGHT,
                allot_fairshare::tree::MAX_WEIGHT
            )));
        }
        self.0
            .commit(Input::SetWeight {
                group: r.name.clone(),
                weight: r.weight,
                by: who.name(),
            })
            .map_err(core_status)?;
        let tree = tree_pb(self.0.core().alloc.tree(now()));
        tree.groups
            .into_iter()
            .find(|g| g.name == r.name)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(r.name))
    }
}

#[tonic::async_trait]
impl pb::nodes_server::Nodes for Api {
    async fn list(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.allow(&req, Ask::Read)?;
        let names: Vec<String> = self.0.core().alloc.nodes().keys().cloned().collect();
        let nodes = names.iter().filter_map(|n| self.node_view(n)).collect();
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn drain(
        &self,
        req: Request<pb::NodeDrainRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let who = self.allow(&req, Ask::Drain)?;
        let r = req.into_inner();
        crate::limits::node("name", &r.name)?;
        crate::limits::reason("reason", &r.reason)?;
        if !self.0.core().alloc.nodes().contains_key(&r.name) {
            return Err(Status::not_found(format!(
                "name: no node {:?}; `allot nodes` lists them",
                r.name
            )));
        }
        if !r.undrain && r.reason.trim().is_empty() {
            return Err(Status::invalid_argument(
                "reason: say why the node drains (kept and shown)",
            ));
        }
        if r.undrain {
            // A cluster undrain lifts the cluster operator's drain only: a health
            // fault is cleared on the host (`allot gpus clear`), a local drain by
            // `allot undrain` there, a lost node by its agent coming back.
            let others: Vec<String> = {
                let c = self.0.core();
                let n = c.alloc.nodes().get(&r.name);
                if n.is_some_and(|n| n.drains.contains_key(DrainAuthor::ClusterOperator.as_str())) {
                    Vec::new()
                } else {
                    n.map(|n| {
                        n.drains
                            .iter()
                            .map(|(by, d)| format!("{by} ({})", d.reason))
                            .collect()
                    })
                    .unwrap_or_default()
                }
            };
            if !others.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "name: {} has no cluster-operator drain to lift; it is drained by {}. A health drain ends when the fault is cleared on the host (`allot gpus clear INDEX --reason TEXT` after a reset or repair); a local drain by `allot undrain` on the host; a lost node when its agent returns",
                    r.name,
                    others.join(", ")
                )));
            }
        }
        let state = match (r.undrain, r.now) {
            (true, _) => NodeState::Ready,
            (false, true) => NodeState::DrainNow,
            (false, false) => NodeState::Draining,
        };
        self.0
            .commit(Input::NodeState {
                node: r.name.clone(),
                state,
                reason: if r.undrain {
                    "undrained by a cluster operator".into()
                } else {
                    r.reason.clone()
                },
                by: DrainAuthor::ClusterOperator.as_str().into(),
                author: who.name(),
            })
            .map_err(core_status)?;
        self.node_view(&r.name)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(r.name))
    }
}

/// Checks a registration; returns the node's spec and GPU UUIDs.
fn check_register(r: &pb::Register) -> Result<(NodeSpec, Vec<String>), Status> {
    let bad = |f: &str, why: &str| Err(Status::invalid_argument(format!("register.{f}: {why}")));
    if r.host.trim().is_empty() {
        return bad("host", "empty; set [agent] host or the system hostname");
    }
    if r.gpus.is_empty() || r.gpus.len() > MAX_HOST_GPUS {
        return bad(
            "gpus",
            "a host registers 1 to 64 GPUs (the agent has no GPU inventory yet?)",
        );
    }
    crate::limits::register(r)?;
    let mut gpus = r.gpus.clone();
    gpus.sort_by_key(|g| g.index);
    // One GPU counted twice would be leased twice: the host's inventory is wrong.
    if let Some(w) = gpus.windows(2).find(|w| w[0].index == w[1].index) {
        return bad(
            "gpus",
            &format!(
                "index {} is registered twice; each GPU once (check the agent's GPU source)",
                w[0].index
            ),
        );
    }
    if let Some(g) = gpus.iter().find(|g| g.index as usize >= MAX_HOST_GPUS) {
        return bad(
            "gpus",
            &format!("index {}: a host's GPUs are indexed 0 to 63", g.index),
        );
    }
    let mut uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    uuids.sort_unstable();
    if let Some(w) = uuids.windows(2).find(|w| w[0] == w[1]) {
        return bad(
            "gpus",
            &format!(
                "UUID {:?} is registered twice; each GPU once (check the agent's GPU source)",
                w[0]
            ),
        );
    }
    Ok((
        NodeSpec {
            name: r.host.clone(),
            cluster: if r.cluster.is_empty() {
                "default".into()
            } else {
                r.cluster.clone()
            },
            gpus: gpus.len() as u32,
            cpu: r.cpu,
            memory_gb: u32::try_from(r.memory_gb).unwrap_or(u32::MAX),
            // An agent that names no type (or predates it) has it read from its
            // GPUs' model.
            gpu_type: if r.gpu_type.trim().is_empty() {
                gpus.first()
                    .map(|g| allot_fairshare::select::gpu_type_of(&g.model))
                    .unwrap_or_default()
            } else {
                r.gpu_type.trim().to_lowercase()
            },
            features: r.features.clone(),
        },
        gpus.iter().map(|g| g.uuid.clone()).collect(),
    ))
}

impl Api {
    /// A host (re)joins (see `Input::Register`); returns the commands it must have
    /// before any other: the leases it lacks, allotd's drains.
    fn register(&self, r: &pb::Register) -> Result<Vec<pb::AllocatorMessage>, Status> {
        let (spec, uuids) = check_register(r)?;
        let name = spec.name.clone();
        let applied = self
            .0
            .record(Input::Register {
                spec,
                gpu_uuids: uuids,
                gpus: r.gpus.iter().map(gpu_seen).collect(),
                running: r
                    .running
                    .iter()
                    .filter_map(|l| lease_from_wire(&l.id))
                    .collect(),
                drains: r.drains.iter().map(host_drain).collect(),
                addr: r.advertise_addr.clone(),
                highest_workload: r.highest_workload,
                highest_lease: r.highest_lease,
                end_strays: true,
                fence_s: r.fence_s,
            })
            .map_err(core_status)?;
        self.0
            .core()
            .alloc
            .agent_connected(&name, now(), r.gpus.iter().map(gpu_report).collect());
        let (backlog, others): (Vec<Out>, Vec<Out>) = applied
            .outs
            .into_iter()
            .partition(|o| matches!(o, Out::Send { node, .. } if *node == name));
        self.0.dispatch(&others);
        Ok(backlog
            .iter()
            .filter_map(|o| match o {
                Out::Send { cmd, .. } => Some(command_pb(cmd)),
                _ => None,
            })
            .collect())
    }

    /// One message from an agent, on its session `session`.
    fn on_agent(&self, node: &str, session: u64, m: pb::AgentMessage) {
        self.0.core().alloc.agent_heard(node, now());
        match m.body {
            Some(pb::agent_message::Body::LeaseStatus(s)) => {
                let Some(l) = s.lease else { return };
                if l.state != pb::LeaseState::Ended as i32 {
                    // A live lease's news for allotd: whether its GPUs are in use
                    // (a repeat changes nothing and is not journaled). An agent
                    // before this word, or one that never judged the lease, says
                    // 0 and 0 (busy again is always above a nonzero threshold).
                    let said = l.idle_since_unix != 0 || l.gpu_util_pct != 0;
                    if let Some(lease) = lease_from_wire(&l.id).filter(|_| said) {
                        let input = Input::LeaseUse {
                            lease,
                            node: node.to_string(),
                            idle_since: u64::try_from(l.idle_since_unix).unwrap_or(0),
                            gpu_util: l.gpu_util_pct,
                        };
                        if let Err(e) = self.0.commit(input) {
                            tracing::warn!(node, error = %e, "lease use not applied");
                        }
                    }
                    return;
                }
                let Some(lease) = lease_from_wire(&l.id) else {
                    return;
                };
                // 0.1 agents name the end only in text.
                let end = match l.end() {
                    pb::LeaseEnd::Unspecified => end_from_agent_text(&l.end_reason, l.exit_code),
                    e => end_from_agent(e, l.exit_code),
                };
                // A process killed by a signal has no exit status; say so where it
                // matters (the part that "exited" did not exit by itself).
                let how = match (l.end(), l.exit_code) {
                    // The agent's words: exit code, signal, OOM kill, cut output.
                    _ if !l.end_detail.is_empty() => {
                        format!("{} ({})", l.end_reason, l.end_detail)
                    }
                    (pb::LeaseEnd::Exited, None) => {
                        format!("{} (killed by a signal)", l.end_reason)
                    }
                    _ => l.end_reason.clone(),
                };
                match self.0.commit(Input::LeaseEnded {
                    lease,
                    end,
                    // Who ended it, when anyone did (a failed start has no rung).
                    reason: if l.ended_by.is_empty() {
                        format!("{how} on {node}")
                    } else {
                        format!("{how} on {node}: {}", l.ended_by)
                    },
                    node: node.to_string(),
                    exit_code: l.exit_code,
                    signal: l.term_signal,
                    part: true,
                    leaving: true,
                }) {
                    Ok(_) | Err(CoreError::UnknownLease(_)) => {}
                    Err(e) => tracing::warn!(node, error = %e, "lease status not applied"),
                }
            }
            Some(pb::agent_message::Body::Health(h)) => self.on_health(node, h),
            Some(pb::agent_message::Body::LogChunk(c)) => self.0.logs.deliver(node, c),
            Some(pb::agent_message::Body::Tty(t)) => self.0.ttys.deliver(node, t),
            Some(pb::agent_message::Body::Register(_)) => {
                tracing::warn!(node, "second register on one stream ignored");
            }
            // Answered on its stream, so the host knows allotd heard it: its
            // fence counts from the last one answered.
            Some(pb::agent_message::Body::Heartbeat(h)) => {
                self.0.core().alloc.agent_fences(node, h.fence_s);
                let body = pb::allocator_message::Body::Heard(pb::Heard { seq: h.seq });
                self.0
                    .answer(node, session, pb::AllocatorMessage { body: Some(body) });
            }
            None => {}
        }
    }

    /// A health report (see `Input::Health`); the GPU list is kept for views.
    fn on_health(&self, node: &str, h: pb::HealthReport) {
        if let Err(e) = crate::limits::health(&h) {
            tracing::warn!(node, error = %e, "health report refused");
            return;
        }
        let gpus = h.gpus.iter().map(gpu_report).collect();
        if !self.0.core().alloc.agent_reported(node, gpus) {
            return;
        }
        let reasons: Vec<String> = h
            .gpus
            .iter()
            .flat_map(|g| {
                g.reasons
                    .iter()
                    .filter(|r| !r.action.is_empty())
                    .map(move |r| format!("{} {}", g.pci, r.signal))
            })
            // The host's own conditions (a disk nearly full) say what and the fix.
            .chain(
                h.host_reasons
                    .iter()
                    .filter(|r| !r.action.is_empty())
                    .map(|r| format!("{}: {}", r.signal, r.detail)),
            )
            .collect();
        if let Err(e) = self.0.commit(Input::Health {
            node: node.to_string(),
            verdict: verdict_of(h.verdict),
            gpus: h.gpus.iter().map(gpu_seen).collect(),
            reasons: reasons.join("; "),
            drains: h.drains.iter().map(host_drain).collect(),
        }) {
            tracing::warn!(node, error = %e, "health report not applied");
        }
    }
}

#[tonic::async_trait]
impl pb::agent_stream_server::AgentStream for Api {
    type SessionStream = BoxStream<pb::AllocatorMessage>;

    async fn session(
        &self,
        req: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let who = self.who(&req)?;
        let fingerprint = crate::conns::peer_certs(req.extensions())
            .and_then(|c| c.first().map(|d| allot_auth::pki::fingerprint(d)))
            .unwrap_or_default();
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before register"))?;
        let Some(pb::agent_message::Body::Register(reg)) = first.body else {
            return Err(Status::invalid_argument(
                "the first message of a session must be register",
            ));
        };
        check_register(&reg)?;
        // A certificate speaks for its own node only: no registering as another.
        self.check(&who, Ask::Session(&reg.host))?;
        let backlog = self.register(&reg)?;
        let node = reg.host.clone();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for m in backlog {
            let _ = tx.send(Ok(m));
        }
        let session = self.0.attach(&node, tx, reg.protocol);
        tracing::info!(node = %node, gpus = reg.gpus.len(), running = reg.running.len(), "agent connected");
        let api = self.clone();
        tokio::spawn(async move {
            loop {
                let msg = inbound.message().await;
                // A node revoked meanwhile is cut off at its next message (its
                // outbound stream already ended at the revocation).
                let revoked = api
                    .0
                    .core()
                    .alloc
                    .creds
                    .node_may_connect(&node, &fingerprint, now())
                    .err();
                if let Some(r) = revoked {
                    tracing::warn!(node = %node, reason = %r, "agent session cut");
                    break;
                }
                match msg {
                    Ok(Some(m)) => api.on_agent(&node, session, m),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(node = %node, error = %e, "agent stream broke");
                        break;
                    }
                }
            }
            tracing::info!(node = %node, "agent disconnected");
            api.0.detach(&node, session);
            api.0.logs.node_gone(&node, session);
            api.0.ttys.node_gone(&node, session);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }
}

/// Serves the services on `listener` until `stop`: TLS with the cluster CA (a
/// client certificate is asked for, not required: users come with tokens), or plain
/// HTTP/2 where `[tls] plaintext_loopback` allows it.
pub async fn grpc(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let conns = server.conns.clone();
    let streams = server.cfg.server.max_streams_per_connection;
    // Bigger messages are refused (OUT_OF_RANGE) before they are buffered whole.
    let max = allot_common::fields::MAX_MESSAGE;
    let mut builder = tonic::transport::Server::builder();
    if !server.cfg.tls.plaintext_loopback {
        let pki = &server.pki;
        builder = builder.tls_config(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(&pki.server_cert, &pki.server_key))
                .client_ca_root(Certificate::from_pem(&pki.ca.cert_pem))
                .client_auth_optional(true)
                .timeout(conns.handshake_timeout()),
        )?;
    }
    let proving = server.clone();
    let prover: crate::conns::Prover = Arc::new(move |parts| prove(&proving, parts));
    let api = Api(server);
    builder
        // Pings find a peer that vanished under a quiet stream (a Watch of an
        // unchanged workload); an unanswered one closes the connection.
        .http2_keepalive_interval(Some(conns.keepalive_interval()))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        // Streams a client resets before they are served (the rapid-reset
        // attack), or that end in protocol errors: past these, GOAWAY and close.
        .http2_max_pending_accept_reset_streams(Some(20))
        .http2_max_local_error_reset_streams(Some(64))
        .max_concurrent_streams(streams)
        .concurrency_limit_per_connection(streams as usize)
        .http2_max_header_list_size(64 * 1024)
        // Each request is proven at its headers, and counted for its
        // connection's idle clock.
        .layer(crate::conns::TrackRequests::new(conns.clone(), prover))
        .add_service(
            pb::workloads_server::WorkloadsServer::new(api.clone()).max_decoding_message_size(max),
        )
        .add_service(pb::org_server::OrgServer::new(api.clone()).max_decoding_message_size(max))
        .add_service(pb::nodes_server::NodesServer::new(api.clone()).max_decoding_message_size(max))
        .add_service(
            pb::enrollment_server::EnrollmentServer::new(api.clone())
                .max_decoding_message_size(max),
        )
        .add_service(pb::admin_server::AdminServer::new(api.clone()).max_decoding_message_size(max))
        .add_service(
            pb::agent_stream_server::AgentStreamServer::new(api).max_decoding_message_size(max),
        )
        .serve_with_incoming_shutdown(accept_nodelay(listener, conns), stop)
        .await?;
    Ok(())
}

/// Serves `Admin` on the admin socket until `stop`, for root and allotd's own user
/// (the socket is 0600 too): `allotd tokens …` and `allotd nodes …` on this host.
pub async fn admin_socket(
    server: Arc<Server>,
    listener: tokio::net::UnixListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use tokio_stream::StreamExt;
    let me = nix::unistd::geteuid().as_raw();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener).filter(move |c| {
        let Ok(c) = c else { return true };
        match c.peer_cred() {
            Ok(cred) if cred.uid() == 0 || cred.uid() == me => true,
            other => {
                tracing::warn!(peer = ?other.map(|c| c.uid()).ok(), "admin socket: refused a caller that is neither root nor allotd's user");
                false
            }
        }
    });
    tonic::transport::Server::builder()
        .add_service(pb::admin_server::AdminServer::new(Api(server)))
        .serve_with_incoming_shutdown(incoming, stop)
        .await?;
    Ok(())
}

/// Accepted connections under the connection caps, with Nagle's algorithm off and
/// TCP keepalive on, closed when idle (see [`crate::conns::Incoming`]).
fn accept_nodelay(
    listener: tokio::net::TcpListener,
    conns: Arc<crate::conns::Conns>,
) -> crate::conns::Incoming {
    crate::conns::Incoming::new(listener, conns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str) -> pb::Gpu {
        pb::Gpu {
            uuid: uuid.into(),
            index,
            ..Default::default()
        }
    }

    #[test]
    fn a_registration_counting_a_gpu_twice_is_refused() {
        let reg = |gpus: Vec<pb::Gpu>| pb::Register {
            host: "node-0".into(),
            gpus,
            ..Default::default()
        };
        let refused = |r: pb::Register| {
            check_register(&r)
                .expect_err("refused")
                .message()
                .to_string()
        };
        let (spec, uuids) =
            check_register(&reg(vec![gpu(1, "GPU-b"), gpu(0, "GPU-a")])).expect("ok");
        assert_eq!(
            (spec.gpus, uuids),
            (2, vec!["GPU-a".to_string(), "GPU-b".into()])
        );
        let m = refused(reg(vec![gpu(0, "GPU-a"), gpu(0, "GPU-b")]));
        assert!(
            m.starts_with("register.gpus: index 0 is registered twice"),
            "{m}"
        );
        let m = refused(reg(vec![gpu(0, "GPU-a"), gpu(1, "GPU-a")]));
        assert!(
            m.starts_with("register.gpus: UUID \"GPU-a\" is registered twice"),
            "{m}"
        );
        let m = refused(reg(vec![gpu(64, "GPU-a")]));
        assert!(m.starts_with("register.gpus: index 64"), "{m}");
    }
}
