//! Requests counted and authenticated per connection: a tower layer around the
//! services that asks its owner what each request's transport and headers prove
//! (before any body is read: a credential shown that is not valid is refused
//! there and then), marks the connection authenticated at its first valid
//! credential, and keeps a request open from its call until its response body is
//! dropped (sent whole, or the stream reset by the client), for the idle clock.

use super::incoming::{Activity, ConnInfo};
use super::Conns;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::transport::server::TlsConnectInfo;
use tonic::transport::CertificateDer;

/// What a request's transport and headers prove, as the layer's owner decides.
pub enum Proof {
    /// Nothing: the request goes on, its connection stays pending.
    Anonymous,
    /// A valid credential of this identity (a user's, a node's): its connection
    /// is authenticated, under that identity's share.
    Identity(String),
    /// Refused before its body is read.
    Refused(tonic::Status),
}

/// Decides what a request proves; may leave what it found in the extensions.
pub type Prover = Arc<dyn Fn(&mut http::request::Parts) -> Proof + Send + Sync>;

/// The layer: wraps each service of the gRPC server.
#[derive(Clone)]
pub struct TrackRequests {
    conns: Arc<Conns>,
    prove: Prover,
}

impl TrackRequests {
    /// Requests counted on the connections of `conns`, proven by `prove`.
    pub fn new(conns: Arc<Conns>, prove: Prover) -> TrackRequests {
        TrackRequests { conns, prove }
    }
}

impl<S> tower::Layer<S> for TrackRequests {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked {
            inner,
            conns: self.conns.clone(),
            prove: self.prove.clone(),
        }
    }
}

/// A service whose requests are proven and counted on their connection.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    conns: Arc<Conns>,
    prove: Prover,
}

/// The connection's activity, from what tonic put in the request.
fn activity_of(ext: &http::Extensions) -> Option<Arc<Activity>> {
    ext.get::<TlsConnectInfo<ConnInfo>>()
        .map(|i| i.get_ref().activity.clone())
        .or_else(|| ext.get::<ConnInfo>().map(|i| i.activity.clone()))
}

/// The client certificates a request's TLS session proved, if any, from its
/// extensions.
pub fn peer_certs(ext: &http::Extensions) -> Option<Arc<Vec<CertificateDer<'static>>>> {
    ext.get::<TlsConnectInfo<ConnInfo>>()
        .and_then(|i| i.peer_certs())
}

/// A request's place in its connection's count, given back on drop.
struct Open(Arc<Activity>);

impl Open {
    fn new(a: Arc<Activity>) -> Open {
        a.begin();
        Open(a)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl<S, Req, B> tower::Service<http::Request<Req>> for Tracked<S>
where
    S: tower::Service<http::Request<Req>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Default + Send + 'static,
{
    type Response = http::Response<Counted<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Req>) -> Self::Future {
        let activity = activity_of(req.extensions());
        let (mut parts, body) = req.into_parts();
        let refusal = match (self.prove)(&mut parts) {
            Proof::Refused(status) => Some(status),
            Proof::Identity(who) => activity
                .as_deref()
                .and_then(|a| self.conns.authenticate(a, &who).err())
                .map(tonic::Status::resource_exhausted),
            Proof::Anonymous => None,
        };
        if let Some(status) = refusal {
            let resp = status
                .into_http::<B>()
                .map(|body| Counted { body, _open: None });
            return Box::pin(std::future::ready(Ok(resp)));
        }
        let open = activity.map(Open::new);
        let fut = self.inner.call(http::Request::from_parts(parts, body));
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| Counted { body, _open: open }))
        })
    }
}

/// A response body that holds its request open until it is dropped.
pub struct Counted<B> {
    body: B,
    _open: Option<Open>,
}

impl<B: http_body::Body + Unpin> http_body::Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
