//! The agent vouches for its local users, as MUNGE does for Slurm: the user
//! commands (`Workloads`, `Org`, `Nodes`) are served on the agent's unix socket too,
//! and each is forwarded to allotd on this host's own mutual-TLS connection with
//! the caller's user name, which the agent takes from the socket's peer credentials
//! (never from the request). allotd accepts that name only from an enrolled node in
//! its `[auth] vouching_hosts`, for the user's own work only: a vouch carries no
//! role. Root and system users (below `[agent] min_uid`) are never vouched for.

use crate::credentials::{with_scheme, Credentials};
use allot_proto::v1 as pb;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Mutex;
use tokio_stream::Stream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// The header allotd reads the vouched-for user from.
pub const VOUCH_HEADER: &str = "x-allot-user";

/// The forwarding services.
pub struct Vouch {
    addr: String,
    state_dir: PathBuf,
    /// No uid below this (and never root) is vouched for.
    min_uid: u32,
    channel: Mutex<Option<Channel>>,
}

impl Vouch {
    /// Forwards to allotd at `addr` with the credentials in `state_dir`, for users
    /// of uid `min_uid` and above.
    pub fn new(addr: &str, state_dir: PathBuf, min_uid: u32) -> Vouch {
        Vouch {
            addr: with_scheme(addr),
            state_dir,
            min_uid,
            channel: Mutex::new(None),
        }
    }

    /// This host's channel to allotd (made once, remade after a failure).
    async fn channel(&self) -> Result<Channel, Status> {
        if let Some(c) = self
            .channel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(c);
        }
        if self.addr == "https://" {
            return Err(Status::failed_precondition(
                "this agent has no allocator (agent.allocator is empty); set ALLOT_SERVER and ALLOT_TOKEN to reach allotd directly",
            ));
        }
        let me = Credentials::load(&self.state_dir).map_err(|e| {
            Status::failed_precondition(format!("this host cannot vouch for you: {e}"))
        })?;
        let ch = me
            .endpoint(&self.addr)
            .map_err(|e| Status::failed_precondition(e.to_string()))?
            .connect()
            .await
            .map_err(|e| {
                Status::unavailable(format!(
                    "cannot reach allotd at {}: {}",
                    self.addr,
                    crate::credentials::root_cause(&e)
                ))
            })?;
        *self.channel.lock().unwrap_or_else(|e| e.into_inner()) = Some(ch.clone());
        Ok(ch)
    }

    /// The request as forwarded: the caller's user name in the vouching header.
    fn forward<T>(&self, req: Request<T>) -> Result<Request<T>, Status> {
        let c = crate::api::caller(&req)?;
        if c.uid == 0 || c.uid < self.min_uid {
            return Err(Status::permission_denied(format!(
                "this host vouches only for its users (uid {} and above), not for uid {}: root and system users reach allotd with a token (ALLOT_TOKEN)",
                self.min_uid.max(1),
                c.uid
            )));
        }
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(c.uid))
            .ok()
            .flatten()
            .ok_or_else(|| {
                Status::permission_denied(format!(
                    "uid {} has no user name on this host; allotd knows users by name",
                    c.uid
                ))
            })?
            .name;
        let value: MetadataValue<_> = user
            .parse()
            .map_err(|_| Status::invalid_argument("the user name is not plain text"))?;
        let mut out = Request::new(req.into_inner());
        out.metadata_mut().insert(VOUCH_HEADER, value);
        Ok(out)
    }

    /// Forgets the channel after a transport failure, so the next call reconnects.
    fn failed(&self, s: Status) -> Status {
        if s.code() == tonic::Code::Unavailable || s.code() == tonic::Code::Unknown {
            *self.channel.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        s
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

macro_rules! forward {
    ($self:ident, $req:ident, $client:path, $method:ident) => {{
        let req = $self.forward($req)?;
        let mut c = <$client>::new($self.channel().await?);
        c.$method(req).await.map_err(|s| $self.failed(s))
    }};
}

#[tonic::async_trait]
impl pb::workloads_server::Workloads for Vouch {
    async fn submit(
        &self,
        req: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            submit
        )
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::Workload>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            cancel
        )
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::Workload>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            get
        )
    }

    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            list
        )
    }

    type WatchStream = BoxStream<pb::Workload>;

    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let r: Response<Streaming<pb::Workload>> = forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            watch
        )?;
        Ok(Response::new(Box::pin(r.into_inner())))
    }

    type LogsStream = BoxStream<pb::LogsChunk>;

    async fn logs(
        &self,
        req: Request<pb::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let r: Response<Streaming<pb::LogsChunk>> = forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            logs
        )?;
        Ok(Response::new(Box::pin(r.into_inner())))
    }

    type AttachStream = BoxStream<pb::AttachOutput>;

    async fn attach(
        &self,
        req: Request<Streaming<pb::AttachInput>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let (meta, ext, keys) = self.forward(req)?.into_parts();
        // A broken stream from the caller ends what is forwarded: allotd detaches.
        let keys = tokio_stream::StreamExt::map_while(keys, Result::ok);
        let mut c = pb::workloads_client::WorkloadsClient::new(self.channel().await?);
        let r = c
            .attach(Request::from_parts(meta, ext, keys))
            .await
            .map_err(|s| self.failed(s))?;
        Ok(Response::new(Box::pin(r.into_inner())))
    }

    async fn history(
        &self,
        req: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            history
        )
    }

    async fn hold(
        &self,
        req: Request<pb::ControlRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            hold
        )
    }

    async fn release(
        &self,
        req: Request<pb::ControlRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            release
        )
    }

    async fn requeue(
        &self,
        req: Request<pb::ControlRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            requeue
        )
    }

    async fn update(
        &self,
        req: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        forward!(
            self,
            req,
            pb::workloads_client::WorkloadsClient<Channel>,
            update
        )
    }
}

#[tonic::async_trait]
impl pb::org_server::Org for Vouch {
    async fn usage(
        &self,
        req: Request<pb::UsageRequest>,
    ) -> Result<Response<pb::UsageResponse>, Status> {
        forward!(self, req, pb::org_client::OrgClient<Channel>, usage)
    }

    async fn get_tree(
        &self,
        req: Request<pb::GetTreeRequest>,
    ) -> Result<Response<pb::GetTreeResponse>, Status> {
        forward!(self, req, pb::org_client::OrgClient<Channel>, get_tree)
    }

    async fn set_weight(
        &self,
        req: Request<pb::SetWeightRequest>,
    ) -> Result<Response<pb::Group>, Status> {
        forward!(self, req, pb::org_client::OrgClient<Channel>, set_weight)
    }
}

#[tonic::async_trait]
impl pb::nodes_server::Nodes for Vouch {
    async fn list(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        forward!(self, req, pb::nodes_client::NodesClient<Channel>, list)
    }

    async fn drain(
        &self,
        req: Request<pb::NodeDrainRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        forward!(self, req, pb::nodes_client::NodesClient<Channel>, drain)
    }
}
