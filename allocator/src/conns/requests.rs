//! Requests counted per connection, for its idle clock: a tower layer around the
//! services that marks a request open from its call until its response body is
//! dropped (sent whole, or the stream reset by the client).

use super::incoming::{Activity, ConnInfo};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::transport::server::TlsConnectInfo;
use tonic::transport::CertificateDer;

/// The layer: wraps each service of the gRPC server.
#[derive(Clone, Copy, Default)]
pub struct TrackRequests;

impl<S> tower::Layer<S> for TrackRequests {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked(inner)
    }
}

/// A service whose requests are counted on their connection.
#[derive(Clone)]
pub struct Tracked<S>(S);

/// The connection's activity, from what tonic put in the request.
fn activity_of(ext: &http::Extensions) -> Option<Arc<Activity>> {
    ext.get::<TlsConnectInfo<ConnInfo>>()
        .map(|i| i.get_ref().activity.clone())
        .or_else(|| ext.get::<ConnInfo>().map(|i| i.activity.clone()))
}

/// The client certificates the TLS session of `req` proved, if any.
pub fn peer_certs<T>(req: &tonic::Request<T>) -> Option<Arc<Vec<CertificateDer<'static>>>> {
    req.extensions()
        .get::<TlsConnectInfo<ConnInfo>>()
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
{
    type Response = http::Response<Counted<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Req>) -> Self::Future {
        let open = activity_of(req.extensions()).map(Open::new);
        let fut = self.0.call(req);
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
