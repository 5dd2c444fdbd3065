//! Who may do what, over real TLS to a real allotd with real agents (issue 11): one
//! table of every RPC × every kind of caller, each cell allowed or refused with the
//! code and the words that name the missing right. An RPC of the proto missing from
//! the table fails the test. Beside it: a node cannot report another node's lease,
//! a revoked node is cut off, and expired, revoked or forged tokens are refused.

mod support;

use allot_proto::v1 as pb;
use std::time::Duration;
use support::{wait_for, Cluster};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::Code;

const LONG: Duration = Duration::from_secs(60);

/// Two teams: alice may charge team-a's project, bob team-b's, carol manages
/// team-b, olga operates, the test user administers; only node 0 (and the revoked
/// node 2) may vouch for users.
fn org() -> String {
    format!(
        "[[group]]\nname = \"team-a\"\nweight = 1\nmembers = [\"alice\", \"allot-test-a\"]\n[[group]]\nname = \"p-a\"\nparent = \"team-a\"\nweight = 1\n[[group]]\nname = \"team-b\"\nweight = 1\nmembers = [\"bob\"]\nmanagers = [\"carol\"]\n[[group]]\nname = \"p-b\"\nparent = \"team-b\"\nweight = 1\n[roles]\noperators = [\"olga\", \"allot-test-b\"]\nadmins = [{:?}]\n[auth]\nvouching_hosts = [\"node-0\", \"node-2\"]\n",
        allot_test_support::current_user()
    )
}

/// The kinds of caller.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Caller {
    Anonymous,
    User,
    OtherUser,
    OtherManager,
    Operator,
    Admin,
    Node,
    OtherNode,
    RevokedNode,
    /// alice, vouched for by node 0.
    VouchedUser,
    /// olga (an operator by token) vouched for by node 0: no role comes with it.
    VouchedOperator,
    /// root, vouched for by node 0.
    VouchedRoot,
    /// alice, vouched for by node 1, which may not vouch.
    VouchedByStranger,
}

const CALLERS: [Caller; 13] = [
    Caller::Anonymous,
    Caller::User,
    Caller::OtherUser,
    Caller::OtherManager,
    Caller::Operator,
    Caller::Admin,
    Caller::Node,
    Caller::OtherNode,
    Caller::RevokedNode,
    Caller::VouchedUser,
    Caller::VouchedOperator,
    Caller::VouchedRoot,
    Caller::VouchedByStranger,
];

/// What a cell expects.
#[derive(Debug, Clone, Copy)]
enum Want {
    Ok,
    /// Refused with this code, the message containing these words.
    No(Code, &'static str),
}

use Want::{No, Ok as Yes};

const ANON: Want = No(Code::Unauthenticated, "authentication required");
const NOT_ADMIN: Want = No(Code::PermissionDenied, "needs the admin role");
const NODE_ONLY: Want = No(Code::PermissionDenied, "may only hold its agent session");
const REVOKED: Want = No(Code::PermissionDenied, "was revoked");
const NOT_NODE: Want = No(Code::PermissionDenied, "is not a node");

const NO_ROLE: Want = No(Code::PermissionDenied, "carries no role");
const ROOT: Want = No(Code::PermissionDenied, "root is never vouched for");
const STRANGER: Want = No(Code::PermissionDenied, "may not vouch for its users");

/// What the vouched callers get: a host vouches for its users' own work, with no
/// role, never for root, and only as a vouching host.
fn vouched(rpc: &str) -> [Want; 4] {
    let pd = Code::PermissionDenied;
    match rpc {
        "Workloads.Submit" => [Yes, No(pd, "may not charge \"p-a\""), ROOT, STRANGER],
        "Workloads.Cancel" | "Workloads.Get" | "Workloads.Watch" | "Workloads.Hold"
        | "Workloads.Release" | "Workloads.Requeue" | "Workloads.Update" => {
            [Yes, No(pd, "only its owner"), ROOT, STRANGER]
        }
        "Workloads.Logs" => [Yes, No(pd, "only its owner, an operator"), ROOT, STRANGER],
        "Workloads.Attach" => [Yes, No(pd, "only its owner (or an admin)"), ROOT, STRANGER],
        "Workloads.List" | "Workloads.History" | "Org.GetTree" | "Org.Usage" | "Nodes.List" => {
            [Yes, Yes, ROOT, STRANGER]
        }
        "AgentStream.Session" => [NOT_NODE, NOT_NODE, ROOT, STRANGER],
        // Only a node's own certificate renews, whatever is vouched.
        "Enrollment.Renew" => [No(pd, "is not a node"); 4],
        "Enrollment.Enroll" => [Yes; 4],
        _ => [NO_ROLE, NO_ROLE, ROOT, STRANGER],
    }
}

/// The table: for each RPC, the answer for each caller in [`CALLERS`] order.
fn table() -> Vec<(&'static str, [Want; 13])> {
    table_9()
        .into_iter()
        .map(|(rpc, row)| {
            let mut all = [Yes; 13];
            all[..9].copy_from_slice(&row);
            all[9..].copy_from_slice(&vouched(rpc));
            (rpc, all)
        })
        .collect()
}

/// The callers that prove themselves: tokens and nodes.
fn table_9() -> Vec<(&'static str, [Want; 9])> {
    let user_read = [ANON, Yes, Yes, Yes, Yes, Yes, NODE_ONLY, NODE_ONLY, REVOKED];
    let see_alices = [
        ANON,
        Yes,
        No(Code::PermissionDenied, "only its owner"),
        No(Code::PermissionDenied, "only its owner"),
        Yes,
        Yes,
        NODE_ONLY,
        NODE_ONLY,
        REVOKED,
    ];
    // Hold, release, requeue, update: the owner and operators, not managers.
    let control = [
        ANON,
        Yes,
        No(Code::PermissionDenied, "only its owner, an operator"),
        No(Code::PermissionDenied, "only its owner, an operator"),
        Yes,
        Yes,
        NODE_ONLY,
        NODE_ONLY,
        REVOKED,
    ];
    let admin_only = [
        ANON, NOT_ADMIN, NOT_ADMIN, NOT_ADMIN, NOT_ADMIN, Yes, NODE_ONLY, NODE_ONLY, REVOKED,
    ];
    vec![
        (
            "Workloads.Submit",
            [
                ANON,
                Yes,
                No(Code::PermissionDenied, "may not charge \"p-a\""),
                No(Code::PermissionDenied, "may not charge \"p-a\""),
                No(Code::PermissionDenied, "may not charge \"p-a\""),
                Yes,
                NODE_ONLY,
                NODE_ONLY,
                REVOKED,
            ],
        ),
        (
            "Workloads.Cancel",
            [
                ANON,
                Yes,
                No(Code::PermissionDenied, "only its owner"),
                No(Code::PermissionDenied, "only its owner"),
                No(Code::PermissionDenied, "only its owner"),
                Yes,
                NODE_ONLY,
                NODE_ONLY,
                REVOKED,
            ],
        ),
        ("Workloads.Get", see_alices),
        ("Workloads.Hold", control),
        ("Workloads.Release", control),
        ("Workloads.Requeue", control),
        ("Workloads.Update", control),
        ("Workloads.List", user_read),
        // Each caller gets the runs they may see (their own, a manager's subtree,
        // everything for operators): reports/tests check the filtering.
        ("Workloads.History", user_read),
        ("Org.Usage", user_read),
        ("Workloads.Watch", see_alices),
        (
            "Workloads.Logs",
            [
                ANON,
                Yes,
                No(Code::PermissionDenied, "only its owner, an operator"),
                No(Code::PermissionDenied, "only its owner, an operator"),
                Yes,
                Yes,
                NODE_ONLY,
                NODE_ONLY,
                REVOKED,
            ],
        ),
        (
            "Workloads.Attach",
            // A terminal is its owner's: operators read its output, never type.
            [
                ANON,
                Yes,
                No(Code::PermissionDenied, "only its owner (or an admin)"),
                No(Code::PermissionDenied, "only its owner (or an admin)"),
                No(Code::PermissionDenied, "only its owner (or an admin)"),
                Yes,
                NODE_ONLY,
                NODE_ONLY,
                REVOKED,
            ],
        ),
        ("Org.GetTree", user_read),
        (
            "Org.SetWeight",
            [
                ANON,
                No(Code::PermissionDenied, "manager of a group above it"),
                No(Code::PermissionDenied, "manager of a group above it"),
                Yes,
                No(Code::PermissionDenied, "manager of a group above it"),
                Yes,
                NODE_ONLY,
                NODE_ONLY,
                REVOKED,
            ],
        ),
        ("Nodes.List", user_read),
        (
            "Nodes.Drain",
            [
                ANON,
                No(Code::PermissionDenied, "needs the operator role"),
                No(Code::PermissionDenied, "needs the operator role"),
                No(Code::PermissionDenied, "needs the operator role"),
                Yes,
                Yes,
                NODE_ONLY,
                NODE_ONLY,
                REVOKED,
            ],
        ),
        (
            "AgentStream.Session",
            [
                ANON,
                NOT_NODE,
                NOT_NODE,
                NOT_NODE,
                NOT_NODE,
                NOT_NODE,
                Yes,
                No(Code::PermissionDenied, "may not act as node"),
                REVOKED,
            ],
        ),
        // The one-time token is the credential, whoever carries it.
        ("Enrollment.Enroll", [Yes; 9]),
        (
            "Enrollment.Renew",
            [
                ANON, NOT_NODE, NOT_NODE, NOT_NODE, NOT_NODE, NOT_NODE, Yes, Yes, REVOKED,
            ],
        ),
        ("Admin.CreateToken", admin_only),
        ("Admin.ListTokens", admin_only),
        ("Admin.RevokeToken", admin_only),
        ("Admin.EnrollNode", admin_only),
        ("Admin.RevokeNode", admin_only),
        ("Admin.RemoveNode", admin_only),
        ("Admin.ListNodeCredentials", admin_only),
    ]
}

/// Every RPC the proto offers over the network (the agent's local API is not
/// allotd's).
fn rpcs_in_proto() -> Vec<String> {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/allot/v1/allot.proto"),
    )
    .expect("proto");
    let mut out = Vec::new();
    let mut service = String::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("service ") {
            service = rest.trim_end_matches('{').trim().to_string();
        } else if let Some(rest) = line.strip_prefix("rpc ") {
            if service != "AgentLocal" {
                let name = rest.split('(').next().unwrap_or("").trim();
                out.push(format!("{service}.{name}"));
            }
        }
    }
    out
}

/// Adds a token, if the caller has one, and a vouched-for user, if a node vouches.
#[derive(Clone)]
struct Token(
    Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    Option<&'static str>,
);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            r.metadata_mut().insert("authorization", t.clone());
        }
        if let Some(u) = self.1 {
            r.metadata_mut()
                .insert("x-allot-user", u.parse().expect("a name"));
        }
        Ok(r)
    }
}

type Conn = InterceptedService<Channel, Token>;

/// The running cluster and each caller's connection.
struct World {
    c: Cluster,
    tokens: std::collections::HashMap<&'static str, String>,
}

impl World {
    fn token(&self, name: &str) -> String {
        self.tokens[name].clone()
    }

    async fn conn(&self, who: Caller) -> Conn {
        let (node, token, vouched) = match who {
            Caller::Anonymous => (None, None, None),
            Caller::User => (None, Some(self.token("alice")), None),
            Caller::OtherUser => (None, Some(self.token("bob")), None),
            Caller::OtherManager => (None, Some(self.token("carol")), None),
            Caller::Operator => (None, Some(self.token("olga")), None),
            Caller::Admin => (None, Some(self.c.token.clone()), None),
            Caller::Node => (Some(0), None, None),
            Caller::OtherNode => (Some(1), None, None),
            Caller::RevokedNode => (Some(2), None, None),
            Caller::VouchedUser => (Some(0), None, Some("alice")),
            Caller::VouchedOperator => (Some(0), None, Some("olga")),
            Caller::VouchedRoot => (Some(0), None, Some("root")),
            Caller::VouchedByStranger => (Some(1), None, Some("alice")),
        };
        let t = token.map(|t| format!("Bearer {t}").parse().expect("token"));
        InterceptedService::new(self.c.channel(node).await, Token(t, vouched))
    }

    /// A workload of alice's, pending or running (what Cancel, Get and Watch
    /// touch).
    async fn alices_workload(&self) -> String {
        let mut w = pb::workloads_client::WorkloadsClient::new(self.conn(Caller::User).await);
        w.submit(submit_p_a())
            .await
            .expect("alice submits")
            .into_inner()
            .id
    }

    /// One call of `rpc` as `who`.
    async fn call(&self, rpc: &str, who: Caller) -> Result<(), tonic::Status> {
        let conn = self.conn(who).await;
        let mut w = pb::workloads_client::WorkloadsClient::new(conn.clone());
        let mut org = pb::org_client::OrgClient::new(conn.clone());
        let mut nodes = pb::nodes_client::NodesClient::new(conn.clone());
        let mut admin = pb::admin_client::AdminClient::new(conn.clone());
        let mut enroll = pb::enrollment_client::EnrollmentClient::new(conn.clone());
        match rpc {
            "Workloads.Submit" => w.submit(submit_p_a()).await.map(drop),
            "Workloads.Cancel" => {
                let id = self.alices_workload().await;
                w.cancel(pb::CancelRequest { id }).await.map(drop)
            }
            "Workloads.Get" => {
                let id = self.alices_workload().await;
                w.get(pb::GetRequest { id }).await.map(drop)
            }
            "Workloads.List" => w.list(pb::ListRequest::default()).await.map(drop),
            "Workloads.History" => w.history(pb::HistoryRequest::default()).await.map(drop),
            "Org.Usage" => org.usage(pb::UsageRequest::default()).await.map(drop),
            "Workloads.Hold" | "Workloads.Release" => {
                let id = self.alices_workload().await;
                let req = pb::ControlRequest { id, hold: false };
                if rpc == "Workloads.Hold" {
                    w.hold(req).await.map(drop)
                } else {
                    w.release(req).await.map(drop)
                }
            }
            "Workloads.Requeue" => {
                let id = self.alices_workload().await;
                // Alice's work waits: a caller with the right is past its check
                // when told that only running work is requeued.
                match w.requeue(pb::ControlRequest { id, hold: false }).await {
                    Err(s)
                        if s.code() == Code::FailedPrecondition
                            && s.message().contains("is not running") =>
                    {
                        Ok(())
                    }
                    r => r.map(drop),
                }
            }
            "Workloads.Update" => {
                let id = self.alices_workload().await;
                w.update(pb::UpdateRequest {
                    id,
                    priority: Some(-1),
                    ..Default::default()
                })
                .await
                .map(drop)
            }
            "Workloads.Watch" => {
                let id = self.alices_workload().await;
                let mut s = w.watch(pb::WatchRequest { id }).await?.into_inner();
                s.message().await.map(drop)
            }
            "Workloads.Logs" => {
                let id = self.alices_workload().await;
                // Alice's work waits (a gang of every node): a caller with the right
                // is past its check when told that there is no output yet.
                match w
                    .logs(pb::LogsRequest {
                        id,
                        ..Default::default()
                    })
                    .await
                {
                    Err(s)
                        if s.code() == Code::FailedPrecondition
                            && s.message().contains("has not started yet") =>
                    {
                        Ok(())
                    }
                    r => r.map(drop),
                }
            }
            "Workloads.Attach" => {
                let id = self.alices_workload().await;
                let first = pb::AttachInput {
                    id,
                    ..Default::default()
                };
                // Alice's work is no session: a caller with the right is past its
                // check when told that it has no terminal.
                match w.attach(tokio_stream::iter([first])).await {
                    Err(s)
                        if s.code() == Code::FailedPrecondition
                            && s.message().contains("has no terminal") =>
                    {
                        Ok(())
                    }
                    r => r.map(drop),
                }
            }
            "Org.GetTree" => org.get_tree(pb::GetTreeRequest {}).await.map(drop),
            "Org.SetWeight" => org
                .set_weight(pb::SetWeightRequest {
                    name: "p-b".into(),
                    weight: 1.0,
                })
                .await
                .map(drop),
            "Nodes.List" => nodes.list(pb::ListNodesRequest {}).await.map(drop),
            "Nodes.Drain" => {
                let r = nodes
                    .drain(pb::NodeDrainRequest {
                        name: Cluster::node_name(0),
                        reason: "rights table".into(),
                        now: false,
                        undrain: false,
                    })
                    .await
                    .map(drop);
                if r.is_ok() {
                    // Lifted again, by whoever could drain.
                    nodes
                        .drain(pb::NodeDrainRequest {
                            name: Cluster::node_name(0),
                            undrain: true,
                            ..Default::default()
                        })
                        .await
                        .expect("undrain");
                }
                r
            }
            "AgentStream.Session" => {
                let mut s = pb::agent_stream_client::AgentStreamClient::new(conn);
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                tx.send(register_as_node_0()).expect("queue");
                // The stream stays open while `tx` lives: ended at once after the
                // answer, so the real agent takes its session back.
                let r = s
                    .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
                    .await
                    .map(drop);
                drop(tx);
                r
            }
            "Enrollment.Enroll" => {
                let name = format!("spare-{}", next());
                let token = self.c.allotd(&["nodes", "enroll", &name]);
                assert!(token.status.success());
                let (_key, csr_pem) = allot_auth::pki::node_request(&name).expect("csr");
                enroll
                    .enroll(pb::EnrollRequest {
                        token: String::from_utf8_lossy(&token.stdout).trim().to_string(),
                        csr_pem,
                    })
                    .await
                    .map(drop)
            }
            "Enrollment.Renew" => {
                let (_key, csr_pem) = allot_auth::pki::node_request("x").expect("csr");
                enroll.renew(pb::RenewRequest { csr_pem }).await.map(drop)
            }
            "Admin.CreateToken" => admin
                .create_token(pb::CreateTokenRequest {
                    user: "dave".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
            "Admin.ListTokens" => admin.list_tokens(pb::ListTokensRequest {}).await.map(drop),
            "Admin.RevokeToken" => {
                let out = self.c.allotd(&["tokens", "create", "--user", "throwaway"]);
                assert!(out.status.success());
                let listed = self.c.allotd(&["tokens", "list"]);
                let text = String::from_utf8_lossy(&listed.stdout).to_string();
                let id = text
                    .lines()
                    .rev()
                    .filter(|l| l.contains("throwaway") && !l.contains("revoked"))
                    .find_map(|l| l.split_whitespace().next())
                    .expect("the throwaway token listed")
                    .to_string();
                admin
                    .revoke_token(pb::RevokeTokenRequest { id })
                    .await
                    .map(drop)
            }
            "Admin.EnrollNode" => admin
                .enroll_node(pb::EnrollNodeRequest {
                    node: format!("offered-{}", next()),
                    ttl_s: 0,
                })
                .await
                .map(drop),
            "Admin.RevokeNode" => {
                let name = format!("doomed-{}", next());
                assert!(self.c.allotd(&["nodes", "enroll", &name]).status.success());
                admin
                    .revoke_node(pb::RevokeNodeRequest { node: name })
                    .await
                    .map(drop)
            }
            "Admin.RemoveNode" => {
                let name = format!("retired-{}", next());
                assert!(self.c.allotd(&["nodes", "enroll", &name]).status.success());
                admin
                    .remove_node(pb::RemoveNodeRequest { node: name })
                    .await
                    .map(drop)
            }
            "Admin.ListNodeCredentials" => admin
                .list_node_credentials(pb::ListNodeCredentialsRequest {})
                .await
                .map(drop),
            other => panic!("{other}: an RPC without a call in this test; add it"),
        }
    }
}

fn next() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

fn submit_p_a() -> pb::SubmitRequest {
    pb::SubmitRequest {
        spec: Some(pb::WorkloadSpec {
            project: "p-a".into(),
            gpus_per_node: 1,
            // A gang of every node while node 1 is drained: it waits, so cancels and
            // watches find it.
            nodes: 3,
            argv: vec!["true".into()],
            ..Default::default()
        }),
    }
}

fn register_as_node_0() -> pb::AgentMessage {
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::Register(pb::Register {
            host: Cluster::node_name(0),
            gpus: vec![pb::Gpu {
                index: 0,
                uuid: "GPU-rights-0".into(),
                ..Default::default()
            }],
            protocol: 2,
            ..Default::default()
        })),
    }
}

fn world(tag: &str) -> World {
    let c = Cluster::start(tag, &org(), 3, 1);
    let mut tokens = std::collections::HashMap::new();
    for name in ["alice", "bob", "carol", "olga"] {
        let out = c.allotd(&["tokens", "create", "--user", name]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokens.insert(
            name,
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        );
    }
    // Node 1 is drained (gangs of three wait), node 2 is revoked: its agent is cut
    // off and its certificate refused.
    let out = c.allot(&[
        "nodes",
        "drain",
        &Cluster::node_name(1),
        "--reason",
        "rights",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.allotd(&["nodes", "revoke", &Cluster::node_name(2)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    World { c, tokens }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn every_rpc_for_every_caller_is_allowed_or_refused_naming_the_right() {
    let table = table();
    let mut in_table: Vec<String> = table.iter().map(|(r, _)| r.to_string()).collect();
    let mut in_proto = rpcs_in_proto();
    in_table.sort();
    in_proto.sort();
    assert_eq!(
        in_proto, in_table,
        "every RPC of the proto has a row in the rights table"
    );
    let w = world("rights-table");
    let rt = runtime();
    let mut wrong = Vec::new();
    for (rpc, row) in &table {
        for (who, want) in CALLERS.iter().zip(row) {
            let got = rt.block_on(w.call(rpc, *who));
            let ok = match (want, &got) {
                (Want::Ok, Ok(())) => true,
                (Want::No(code, words), Err(s)) => s.code() == *code && s.message().contains(words),
                _ => false,
            };
            if !ok {
                wrong.push(format!(
                    "{rpc} as {who:?}: wanted {want:?}, got {:?}",
                    got.map_err(|s| (s.code(), s.message().to_string()))
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Seeing is filtered too: bob's list holds none of alice's work, the operator's
    // all of it.
    rt.block_on(async {
        for (who, sees_alice) in [(Caller::OtherUser, false), (Caller::Operator, true)] {
            let list = pb::workloads_client::WorkloadsClient::new(w.conn(who).await)
                .list(pb::ListRequest::default())
                .await
                .expect("list")
                .into_inner()
                .workloads;
            let any_alice = list
                .iter()
                .any(|x| x.spec.as_ref().is_some_and(|s| s.user == "alice"));
            assert_eq!(any_alice, sees_alice, "{who:?}: {list:?}");
        }
    });
}

#[test]
fn a_user_cannot_submit_as_another_or_as_root_and_the_audit_names_who() {
    let w = world("rights-user");
    let rt = runtime();
    rt.block_on(async {
        let mut c = pb::workloads_client::WorkloadsClient::new(w.conn(Caller::User).await);
        for other in ["bob", "root"] {
            let mut r = submit_p_a();
            if let Some(s) = r.spec.as_mut() {
                s.user = other.into();
            }
            let e = c.submit(r).await.expect_err("refused");
            assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
            assert!(e.message().contains("only as themself"), "{e:?}");
        }
        // Her own work runs as her; the cancel is recorded with its author.
        let id = c.submit(submit_p_a()).await.expect("own").into_inner().id;
        // Bob may not depend on it: to him it does not exist, in the words a
        // workload that never was gets (an afterok would tell him how hers ended).
        let mut bob = pb::workloads_client::WorkloadsClient::new(w.conn(Caller::OtherUser).await);
        let after = |on: &str| {
            let mut r = submit_p_a();
            if let Some(s) = r.spec.as_mut() {
                s.project = "p-b".into();
                s.dependencies = vec![pb::Dependency {
                    kind: "afterok".into(),
                    id: on.into(),
                }];
            }
            r
        };
        for (on, named) in [(id.clone(), id.clone()), (format!("{id}_0"), id.clone()), ("999999".into(), "999999".into())] {
            let e = bob.submit(after(&on)).await.expect_err("refused");
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert_eq!(
                e.message(),
                format!("dependencies[0].id: no workload {named} (or it ended longer ago than allotd keeps ended work); `allot queue --all` lists them"),
                "{on}"
            );
        }
        // Her own dependency on it is taken.
        let mut mine = after(&id);
        if let Some(s) = mine.spec.as_mut() {
            s.project = "p-a".into();
        }
        let dep = c.submit(mine).await.expect("her own dependency").into_inner().id;
        c.cancel(pb::CancelRequest { id: dep }).await.expect("cancel");
        c.cancel(pb::CancelRequest { id: id.clone() })
            .await
            .expect("cancel");
        let got = c
            .get(pb::GetRequest { id })
            .await
            .expect("get")
            .into_inner();
        assert_eq!(got.spec.expect("spec").user, "alice");
        assert!(
            got.history
                .iter()
                .any(|h| h.ends_with("cancelled by alice")),
            "{:?}",
            got.history
        );
    });
}

#[test]
fn a_node_cannot_end_another_nodes_lease_and_a_revoked_node_is_cut_off() {
    let w = world("rights-node");
    // Node 2 was revoked: its agent is disconnected and stays so.
    wait_for("the revoked node to be disconnected", LONG, || {
        (w.c.node_view(2)["connected"] == false).then_some(())
    });
    // A lease on some node; another node reports it ended.
    let id =
        w.c.submit(&["--project", "p-a", "--gpus", "1"], "sleep 600");
    let running = w.c.wait_state(&id, "running", LONG);
    let (_, on) = Cluster::node_of(&running);
    let other = if on == 0 { 1 } else { 0 };
    let lease = running["lease_ids"][0].as_str().expect("lease").to_string();
    let rt = runtime();
    rt.block_on(async {
        let mut s = pb::agent_stream_client::AgentStreamClient::new(w.c.channel(Some(other)).await);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut reg = register_as_node_0();
        if let Some(pb::agent_message::Body::Register(r)) = reg.body.as_mut() {
            r.host = Cluster::node_name(other);
            r.gpus[0].uuid = format!("GPU-other-{other}");
        }
        tx.send(reg).expect("queue");
        tx.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::LeaseStatus(pb::LeaseStatus {
                lease: Some(pb::Lease {
                    id: lease.clone(),
                    state: pb::LeaseState::Ended as i32,
                    end: pb::LeaseEnd::Exited as i32,
                    exit_code: Some(1),
                    end_reason: "exited".into(),
                    ..Default::default()
                }),
            })),
        })
        .expect("queue");
        // Then a health report with a drain of its own: allotd takes a session's
        // messages in order, so once the drain shows, the lease report was read.
        tx.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::Health(pb::HealthReport {
                verdict: pb::HostVerdict::Ok as i32,
                drains: vec![pb::DrainInfo {
                    by: "local-operator".into(),
                    author: "marker".into(),
                    reason: "after the lease report".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
        })
        .expect("queue");
        let _session = s
            .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .expect("the other node's own session");
        let read = || {
            let v = w.c.node_view(other);
            v["drains"]
                .as_array()?
                .iter()
                .any(|d| d["author"] == "marker")
                .then_some(())
        };
        tokio::task::block_in_place(|| wait_for("the marker drain", LONG, read));
        drop(tx);
    });
    // Still running where it runs; the other agent takes its session back.
    let w2 = w.c.status(&id);
    assert_eq!(w2["state"], "running", "{w2}");
    w.c.wait_connected(2);
}

#[test]
fn expired_revoked_and_forged_tokens_are_refused() {
    let w = world("rights-token");
    let rt = runtime();
    let list = |token: &str| {
        let t: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse().expect("t");
        rt.block_on(async {
            let conn = InterceptedService::new(w.c.channel(None).await, Token(Some(t), None));
            pb::workloads_client::WorkloadsClient::new(conn)
                .list(pb::ListRequest::default())
                .await
                .map(drop)
        })
    };
    // Forged: the right shape, not one of allotd's.
    let forged = allot_auth::new_secret("allot").expect("random");
    let e = list(&forged).expect_err("forged");
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("not a token of this allotd"), "{e:?}");
    // Revoked.
    let out = w.c.allotd(&["tokens", "create", "--user", "erin"]);
    let erin = String::from_utf8_lossy(&out.stdout).trim().to_string();
    list(&erin).expect("a fresh token works");
    let listed = String::from_utf8_lossy(&w.c.allotd(&["tokens", "list"]).stdout).to_string();
    let id = listed
        .lines()
        .find(|l| l.contains("erin"))
        .and_then(|l| l.split_whitespace().next())
        .expect("listed")
        .to_string();
    assert!(w.c.allotd(&["tokens", "revoke", &id]).status.success());
    let e = list(&erin).expect_err("revoked");
    assert!(e.message().contains("was revoked"), "{e:?}");
    // Expired: a token for one second, refused once the second has passed.
    let out =
        w.c.allotd(&["tokens", "create", "--user", "finn", "--expires", "1s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let finn = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let e = wait_for("the token to expire", Duration::from_secs(10), || {
        list(&finn).err()
    });
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("expired"), "{e:?}");
    // An enrollment token is spent by its use.
    let out = w.c.allotd(&["nodes", "enroll", "once"]);
    let once = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let enroll = |token: &str| {
        let (_k, csr_pem) = allot_auth::pki::node_request("once").expect("csr");
        rt.block_on(async {
            pb::enrollment_client::EnrollmentClient::new(w.c.channel(None).await)
                .enroll(pb::EnrollRequest {
                    token: token.into(),
                    csr_pem,
                })
                .await
                .map(|r| r.into_inner())
        })
    };
    let got = enroll(&once).expect("first use");
    assert_eq!(got.node, "once");
    let e = enroll(&once).expect_err("second use");
    assert!(e.message().contains("already used"), "{e:?}");
}

#[test]
fn an_agent_vouches_for_its_own_users_own_work_and_never_for_root() {
    let (Some((uid_a, gid_a)), Some((uid_b, gid_b))) = (
        allot_test_support::test_user("allot-test-a"),
        allot_test_support::test_user("allot-test-b"),
    ) else {
        return;
    };
    let mut w = world("rights-vouch");
    // Node 0's socket open to the host's users, as a login host's is to its group.
    w.c.agent_extra = "socket_mode = \"0666\"\n".into();
    w.c.kill9_agent(0);
    w.c.start_agent(0, 1);
    let socket = w.c.node_dir(0).join("agent.sock");
    wait_for("node 0's agent", LONG, || {
        std::os::unix::net::UnixStream::connect(&socket)
            .ok()
            .map(drop)
    });
    // No token: the CLI goes through node 0's agent, which names the caller.
    let allot = |uid: Option<(u32, u32)>, args: &[&str]| {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new(support::sibling("allot", "allot-cli"));
        c.args(args)
            .env_remove("ALLOT_TOKEN")
            .env_remove("ALLOT_SERVER")
            .env("HOME", "/nonexistent")
            .env("ALLOT_SOCKET", &socket);
        if let Some((u, g)) = uid {
            c.uid(u).gid(g);
        }
        c.output().expect("allot runs")
    };
    let a = Some((uid_a, gid_a));
    let out = allot(
        a,
        &[
            "submit",
            "--project",
            "p-a",
            "--nodes",
            "3",
            "--json",
            "--",
            "true",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = allot_test_support::json_of(&["submit"], &out)["id"]
        .as_str()
        .expect("id")
        .to_string();
    let got = allot_test_support::json_of(&["status"], &allot(a, &["status", &id, "--json"]));
    assert_eq!(got["user"], "allot-test-a", "{got}");
    // A local account named like an operator in [roles] gets no role from a vouch.
    let b = Some((uid_b, gid_b));
    let out = allot(
        b,
        &["nodes", "drain", &Cluster::node_name(1), "--reason", "x"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("carries no role"),
        "{err}"
    );
    let out = allot(b, &["logs", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("only its owner"),
        "{err}"
    );
    // Root is never vouched for, by the agent (nor by allotd).
    let out = allot(None, &["share"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("vouches only for its users"),
        "{err}"
    );
    // Its own work: cancelled by its owner through the host, and the audit names who.
    let out = allot(a, &["cancel", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = allot_test_support::json_of(&["status"], &allot(a, &["status", &id, "--json"]));
    assert!(
        got["history"]
            .to_string()
            .contains("cancelled by allot-test-a vouched by node-0"),
        "{got}"
    );
    // A token user cannot borrow the vouching header: only a node's word counts.
    let rt = runtime();
    rt.block_on(async {
        let conn = w.conn(Caller::User).await;
        let mut r = tonic::Request::new(pb::ListRequest::default());
        r.metadata_mut()
            .insert("x-allot-user", "allot-test-a".parse().expect("name"));
        let mut c = pb::workloads_client::WorkloadsClient::new(conn);
        let seen = c.list(r).await.expect("list").into_inner().workloads;
        // alice (the token) sees none of allot-test-a's work despite the header.
        assert!(
            seen.iter()
                .all(|x| x.spec.as_ref().is_some_and(|s| s.user == "alice")),
            "{seen:?}"
        );
    });
}

#[test]
fn a_login_host_vouches_for_its_users_and_takes_no_work() {
    let Some((uid, gid)) = allot_test_support::test_user("allot-test-a") else {
        return;
    };
    let c = Cluster::start(
        "rights-login",
        // The login host is named: no node vouches for everyone by default.
        "[[group]]\nname = \"p-a\"\nweight = 1\nmembers = [\"allot-test-a\"]\n[auth]\nvouching_hosts = [\"node-1\"]\n",
        1,
        1,
    );
    // A login host: an enrolled agent with no GPUs, its socket for its users.
    let d = c.node_dir(1);
    std::fs::create_dir_all(&d).expect("dir");
    std::fs::write(
        d.join("agent.toml"),
        format!(
            "[agent]\nsocket = {:?}\nstate_dir = {:?}\nallocator = \"https://{}\"\nhost = \"node-1\"\nsocket_mode = \"0666\"\n[health]\nsource = \"none\"\nkmsg = \"\"\n",
            d.join("agent.sock"),
            d.join("state"),
            c.addr
        ),
    )
    .expect("config");
    c.enroll(1);
    let log = std::fs::File::create(d.join("agent.log")).expect("log");
    let mut login = std::process::Command::new(support::sibling("allot-agent", "allot-agent"))
        .arg("--config")
        .arg(d.join("agent.toml"))
        .stderr(log)
        .spawn()
        .expect("the login host's agent");
    let socket = d.join("agent.sock");
    wait_for("the login host's agent", LONG, || {
        std::os::unix::net::UnixStream::connect(&socket)
            .ok()
            .map(drop)
    });
    let allot = |args: &[&str]| {
        use std::os::unix::process::CommandExt;
        std::process::Command::new(support::sibling("allot", "allot-cli"))
            .args(args)
            .env_remove("ALLOT_TOKEN")
            .env_remove("ALLOT_SERVER")
            .env("HOME", "/nonexistent")
            .env("ALLOT_SOCKET", &socket)
            .uid(uid)
            .gid(gid)
            .output()
            .expect("allot runs")
    };
    // The user's work goes through it, and runs on the GPU host.
    let out = allot(&["submit", "--project", "p-a", "--json", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = allot_test_support::json_of(&["submit"], &out)["id"]
        .as_str()
        .expect("id")
        .to_string();
    let w = c.wait_state(&id, "completed", LONG);
    assert_eq!(w["user"], "allot-test-a", "{w}");
    assert_eq!(w["node_names"], serde_json::json!([]), "{w}");
    // It is no node of the cluster: it registers no GPUs and takes no work.
    let nodes = c.json(&["nodes", "--json"]);
    assert!(
        nodes
            .as_array()
            .is_some_and(|a| a.iter().all(|n| n["name"] != "node-1")),
        "{nodes}"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(login.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = login.wait();
}

#[test]
fn by_default_a_node_vouches_only_for_users_whose_work_runs_on_it() {
    // Work runs as a host account that is not root (root is never vouched for).
    if allot_test_support::test_user("allot-test-a").is_none() {
        return;
    }
    let me = "allot-test-a";
    // The packaged default: no [auth] section, so no vouching host.
    let org = "[[group]]\nname = \"p-a\"\nweight = 1\nmembers = [\"allot-test-a\", \"bob\"]\n";
    let c = Cluster::start("rights-vouch-default", org, 2, 1);
    let out = c.allotd(&["tokens", "create", "--user", me]);
    let token: tonic::metadata::MetadataValue<_> =
        format!("Bearer {}", String::from_utf8_lossy(&out.stdout).trim())
            .parse()
            .expect("token");
    let rt = runtime();
    let list_as = |node: usize, user: &'static str| {
        rt.block_on(async {
            let conn =
                InterceptedService::new(c.channel(Some(node)).await, Token(None, Some(user)));
            pb::workloads_client::WorkloadsClient::new(conn)
                .list(pb::ListRequest::default())
                .await
                .map(drop)
        })
    };
    let refused = |node: usize, user: &'static str| {
        let e = list_as(node, user).expect_err("no vouch without work there");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message()
                .contains(&format!("has no work running there; {user} needs a token")),
            "{e:?}"
        );
    };
    // Nothing of hers runs anywhere: no node speaks for her.
    refused(0, me);
    refused(1, me);
    let id = rt.block_on(async {
        let conn = InterceptedService::new(c.channel(None).await, Token(Some(token), None));
        pb::workloads_client::WorkloadsClient::new(conn)
            .submit(pb::SubmitRequest {
                spec: Some(pb::WorkloadSpec {
                    project: "p-a".into(),
                    gpus_per_node: 1,
                    nodes: 1,
                    argv: vec!["sleep".into(), "600".into()],
                    ..Default::default()
                }),
            })
            .await
            .expect("she submits")
            .into_inner()
            .id
    });
    let w = c.wait_state(&id, "running", LONG);
    let on = w["runs"][0]["nodes"][0]
        .as_str()
        .expect("a node")
        .to_string();
    let (here, there) = if on == Cluster::node_name(0) {
        (0, 1)
    } else {
        (1, 0)
    };
    // The node her work runs on vouches for her, and for nobody else; the other not.
    list_as(here, me).expect("her job's node speaks for her");
    refused(here, "bob");
    refused(there, me);
    // Once it has ended, that node no longer speaks for her either.
    assert!(c.allot(&["cancel", &id]).status.success());
    c.wait_state(&id, "cancelled", LONG);
    refused(here, me);
}
