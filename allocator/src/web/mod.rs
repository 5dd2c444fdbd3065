//! allotd's web pages, on the same HTTP listener as `/metrics`: the org tree, a
//! project's queue, a workload, nodes and GPUs, usage over time. Server-rendered
//! HTML with inline SVG, one stylesheet and one small script served from here (no
//! CDN, works offline), under a strict Content-Security-Policy.
//!
//! A login exchanges a token for a session cookie ([`sessions`]); every page then
//! asks the gRPC API's own handlers as that user (`api::WebWho`), so a page shows
//! and does exactly what the user's `allot` may, refused with the same words. Every
//! form carries the session's CSRF secret; a POST without it changes nothing.

mod html;
mod pages;
pub mod sessions;

use crate::api::{Api, WebWho};
use crate::serve::{now, Server};
use crate::state::{Ask, Who};
use allot_proto::v1 as pb;
use axum::extract::{Form, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use html::Viewer;
use sessions::{Session, Sessions};
use std::sync::Arc;
use tonic::Request;

/// The cookies' names: the session's, and the login form's own CSRF cookie
/// (before there is a session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Names {
    session: &'static str,
    login: &'static str,
}

/// Over TLS, `__Host-` names: a browser takes such a cookie only Secure, for
/// Path=/, with no Domain, so a page of another port or a sibling host (plain
/// HTTP) cannot set one, nor toss its own session in.
const TLS_NAMES: Names = Names {
    session: "__Host-allot_session",
    login: "__Host-allot_login",
};
/// On a loopback listener (plain HTTP, one host): plain names, since a browser
/// keeps nothing of one loopback port apart from another's.
const PLAIN_NAMES: Names = Names {
    session: "allot_session",
    login: "allot_login",
};
/// Failed logins one address may make in a minute.
pub const LOGIN_TRIES: u32 = 10;
/// Most of a run's output a page shows: its end.
const LOG_TAIL: usize = 64 * 1024;
/// Most form body a POST may send.
const FORM_LIMIT: usize = 8 * 1024;

/// What every handler shares.
#[derive(Clone)]
struct App {
    server: Arc<Server>,
    sessions: Arc<Sessions>,
    /// Cookies are `Secure` and `__Host-` (the listener is TLS).
    secure: bool,
    names: Names,
    logins: Arc<sessions::LoginTries>,
}

/// The pages' routes, to be merged with `/metrics`' router.
pub fn router(server: Arc<Server>, secure: bool) -> axum::Router {
    let app = App {
        sessions: Arc::new(Sessions::new(server.cfg.server.web_session)),
        server,
        secure,
        names: if secure { TLS_NAMES } else { PLAIN_NAMES },
        logins: Arc::new(sessions::LoginTries::new(LOGIN_TRIES, 60)),
    };
    axum::Router::new()
        .route("/", get(tree_page))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/project/{name}", get(queue_page))
        .route("/workload/{id}", get(workload_page))
        .route("/workload/{id}/log", get(workload_log))
        .route("/workload/{id}/cancel", post(cancel))
        .route("/nodes", get(nodes_page))
        .route("/nodes/{name}/drain", post(drain))
        .route("/nodes/{name}/undrain", post(undrain))
        .route("/usage", get(usage_page))
        .route("/static/allot.css", get(css))
        .route("/static/allot.js", get(js))
        .layer(axum::extract::DefaultBodyLimit::max(FORM_LIMIT))
        .layer(axum::middleware::from_fn(same_origin_posts))
        .layer(axum::middleware::map_response(never_sniffed))
        .with_state(app)
}

/// Every answer, pages or not (a run's log, an error): never sniffed into HTML,
/// and anything without a policy of its own runs nothing.
async fn never_sniffed(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.entry(header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(HeaderValue::from_static("nosniff"));
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(
            "default-src 'none'; frame-ancestors 'none'; sandbox",
        ));
    r
}

/// A POST another origin's page made (a login CSRF, a tossed form): refused
/// before any handler, by what the browser says of it, which a page cannot
/// forge. A client that is not a browser sends neither header.
async fn same_origin_posts(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if req.method() == axum::http::Method::POST {
        if let Some(why) = cross_origin(req.headers()) {
            tracing::info!(why, "web: a cross-origin POST refused");
            return html(
                StatusCode::FORBIDDEN,
                html::page("Refused", None, 0, &format!("<p id=\"error\">{why}</p>")),
            );
        }
    }
    next.run(req).await
}

/// Why a POST's headers show another origin's page sent it, if they do.
fn cross_origin(h: &HeaderMap) -> Option<&'static str> {
    // A browser that says where the request came from is taken at its word: the
    // pages' `Referrer-Policy: no-referrer` makes it send `Origin: null` even on
    // their own POSTs (the Fetch standard), so Origin is read only without it.
    if let Some(site) = h.get("sec-fetch-site") {
        return match site.to_str() {
            Ok("same-origin" | "none") => None,
            _ => Some("this form was sent by another site's page (Sec-Fetch-Site); use allotd's own pages"),
        };
    }
    let origin = h.get(header::ORIGIN)?;
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let authority = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, a)| a);
    if authority.is_some_and(|a| !host.is_empty() && a.eq_ignore_ascii_case(host)) {
        None
    } else {
        Some("this form was sent by another origin's page (Origin); use allotd's own pages")
    }
}

/// What every page is sent with: HTML, only allotd's own script and sheet, never
/// framed, sniffed, cached or named in another site's Referer.
const PAGE_HEADERS: [(header::HeaderName, &str); 6] = [
    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "no-referrer"),
    (header::CACHE_CONTROL, "no-store"),
];

/// An HTML answer with the headers every page carries.
fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    for (name, value) in PAGE_HEADERS {
        r.headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    r
}

/// A redirect after a form (303: the browser GETs `to`).
fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// A cookie's value from the request.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `Set-Cookie` for `name=value` (Path=/, no Domain, HttpOnly, SameSite=Strict,
/// Secure over TLS: what a `__Host-` name asks); `max_age` 0 removes it.
fn set_cookie(r: &mut Response, name: &str, value: &str, max_age: u64, secure: bool) {
    let c = format!(
        "{name}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    );
    if let Ok(v) = HeaderValue::from_str(&c) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
}

/// The logged-in session of this request, if its token still holds.
fn session(app: &App, headers: &HeaderMap) -> Option<Session> {
    let id = cookie(headers, app.names.session)?;
    let at = now();
    let s = app.sessions.get(id, at)?;
    if app.server.core().alloc.creds.token_live(&s.token_id, at) {
        Some(s)
    } else {
        app.sessions.close(id);
        None
    }
}

/// Who sees a page of session `s`.
fn viewer(s: &Session) -> Viewer<'_> {
    Viewer {
        user: &s.user,
        csrf: &s.csrf,
    }
}

/// A tonic request made by `who`.
fn as_who<T>(who: &Who, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.extensions_mut().insert(WebWho(who.clone()));
    r
}

/// An error page for what the API refused, with its status and its words.
fn refused(s: &Session, status: &tonic::Status) -> Response {
    let code = match status.code() {
        tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let v = viewer(s);
    html(
        code,
        html::page(
            "Refused",
            Some(&v),
            0,
            &format!(
                r#"<p class="error" id="error">{}</p><p><a href="/">Back to the org tree</a></p>"#,
                html::esc(status.message())
            ),
        ),
    )
}

/// The logged-in session, or (returned from the handler) the way to the login page.
macro_rules! logged_in {
    ($app:expr, $headers:expr) => {
        match session(&$app, &$headers) {
            Some(s) => s,
            None => return see_other("/login"),
        }
    };
}

/// The form every POST sends: the CSRF secret and, for a drain, a reason.
#[derive(serde::Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

/// Whether a POST carries this session's CSRF secret.
fn csrf_ok(s: &Session, shown: &str) -> bool {
    allot_auth::same_hash(
        &allot_auth::hash_secret(&s.csrf),
        &allot_auth::hash_secret(shown),
    ) && !shown.is_empty()
}

fn csrf_refused(s: &Session) -> Response {
    refused(
        s,
        &tonic::Status::permission_denied(
            "this form's secret (CSRF) is missing or stale: nothing was changed; reload the page and try again",
        ),
    )
}

async fn tree_page(State(app): State<App>, headers: HeaderMap) -> Response {
    let s = logged_in!(app, headers);
    let who = Who::User(s.user.clone());
    let api = Api(app.server.clone());
    let t = match pb::org_server::Org::get_tree(&api, as_who(&who, pb::GetTreeRequest {})).await {
        Ok(t) => t.into_inner(),
        Err(e) => return refused(&s, &e),
    };
    let v = viewer(&s);
    html(
        StatusCode::OK,
        html::page("Org tree", Some(&v), 30, &pages::tree(&t)),
    )
}

async fn queue_page(
    State(app): State<App>,
    headers: HeaderMap,
    Path(project): Path<String>,
) -> Response {
    let s = logged_in!(app, headers);
    let who = Who::User(s.user.clone());
    let api = Api(app.server.clone());
    let req = pb::ListRequest {
        project: project.clone(),
        ..Default::default()
    };
    let ws = match pb::workloads_server::Workloads::list(&api, as_who(&who, req)).await {
        Ok(r) => r.into_inner().workloads,
        Err(e) => return refused(&s, &e),
    };
    let v = viewer(&s);
    html(
        StatusCode::OK,
        html::page(
            &format!("Queue of {project}"),
            Some(&v),
            30,
            &pages::queue(&project, &ws, now() as i64),
        ),
    )
}

async fn workload_page(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let s = logged_in!(app, headers);
    let who = Who::User(s.user.clone());
    let api = Api(app.server.clone());
    let req = pb::GetRequest { id: id.clone() };
    let w = match pb::workloads_server::Workloads::get(&api, as_who(&who, req)).await {
        Ok(r) => r.into_inner(),
        Err(e) => return refused(&s, &e),
    };
    let live = matches!(
        w.state(),
        pb::WorkloadState::Pending | pb::WorkloadState::Running
    );
    let may_cancel = live
        && w.id.parse::<u64>().is_ok_and(|n| {
            app.server
                .core()
                .alloc
                .authorize(&who, Ask::Cancel(n))
                .is_ok()
        });
    let v = viewer(&s);
    let title = if w.spec.as_ref().is_some_and(|s| !s.name.is_empty()) {
        format!(
            "Workload {} ({})",
            w.id,
            w.spec.as_ref().map_or("", |s| s.name.as_str())
        )
    } else {
        format!("Workload {}", w.id)
    };
    html(
        StatusCode::OK,
        html::page(
            &title,
            Some(&v),
            if live { 15 } else { 0 },
            &pages::workload(&w, may_cancel.then_some(s.csrf.as_str()), now() as i64),
        ),
    )
}

/// The end of the latest run's output, as text (the page's script reads it).
async fn workload_log(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return (StatusCode::UNAUTHORIZED, "log in again\n").into_response();
    };
    let who = Who::User(s.user.clone());
    let api = Api(app.server.clone());
    let req = pb::LogsRequest {
        id,
        stream: pb::LogStream::Stdout as i32,
        ..Default::default()
    };
    let text = match pb::workloads_server::Workloads::logs(&api, as_who(&who, req)).await {
        Ok(r) => {
            use tokio_stream::StreamExt;
            let mut stream = r.into_inner();
            let mut out: Vec<u8> = Vec::new();
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                match tokio::time::timeout_at(deadline, stream.next()).await {
                    Ok(Some(Ok(chunk))) => {
                        out.extend_from_slice(&chunk.data);
                        if out.len() > 2 * LOG_TAIL {
                            out.drain(..out.len() - LOG_TAIL);
                        }
                    }
                    Ok(Some(Err(e))) => {
                        out.extend_from_slice(format!("\n({})\n", e.message()).as_bytes());
                        break;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        out.extend_from_slice(b"\n(the node did not answer in time)\n");
                        break;
                    }
                }
            }
            if out.len() > LOG_TAIL {
                out.drain(..out.len() - LOG_TAIL);
            }
            if out.is_empty() {
                "(no output yet)\n".to_string()
            } else {
                String::from_utf8_lossy(&out).into_owned()
            }
        }
        Err(e) => format!("({})\n", e.message()),
    };
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn cancel(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    let s = logged_in!(app, headers);
    if !csrf_ok(&s, &f.csrf) {
        return csrf_refused(&s);
    }
    let who = Who::User(s.user.clone());
    let api = Api(app.server.clone());
    let req = pb::CancelRequest { id: id.clone() };
    match pb::workloads_server::Workloads::cancel(&api, as_who(&who, req)).await {
        Ok(_) => see_other(&format!("/workload/{}", html::url_part(&id))),
        Err(e) => refused(&s, &e),
    }
}

async fn node_action(
    app: App,
    headers: HeaderMap,
    name: String,
    f: ActionForm,
    undrain: bool,
) -> Response {
    let s = logged_in!(app, headers);
    if !csrf_ok(&s, &f.csrf) {
        return csrf_refused(&s);
    }
    let who = Who::User(s.user.clone());
    let api = Api(app.server.clone());
    let req = pb::NodeDrainRequest {
        name,
        reason: if f.reason.trim().is_empty() {
            "from the web page".into()
        } else {
            f.reason
        },
        now: false,
        undrain,
    };
    match pb::nodes_server::Nodes::drain(&api, as_who(&who, req)).await {
        Ok(_) => see_other("/nodes"),
        Err(e) => refused(&s, &e),
    }
}

async fn drain(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    node_action(app, headers, name, f, false).await
}

async fn undrain(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    node_action(app, headers, name, f, true).await
}

async fn nodes_page(State(app): State<App>, headers: HeaderMap) -> Response {
    let s = logged_in!(app, headers);
    let who = Who::User(s.user.clone());
    let api = Api(app.server.clone());
    let ns = match pb::nodes_server::Nodes::list(&api, as_who(&who, pb::ListNodesRequest {})).await
    {
        Ok(r) => r.into_inner().nodes,
        Err(e) => return refused(&s, &e),
    };
    // The leases on them this user may see, with their GPUs' use.
    let req = pb::ListRequest {
        state: pb::WorkloadState::Running as i32,
        ..Default::default()
    };
    let mut leases = std::collections::BTreeMap::new();
    if let Ok(r) = pb::workloads_server::Workloads::list(&api, as_who(&who, req)).await {
        let at = now() as i64;
        for w in r.into_inner().workloads {
            if let Some(run) = w.runs.last() {
                leases.insert(
                    run.lease_id.clone(),
                    pages::LeaseUse {
                        workload: w.id.clone(),
                        util: pages::use_word(run, at),
                    },
                );
            }
        }
    }
    let operator = app.server.core().alloc.authorize(&who, Ask::Drain).is_ok();
    let v = viewer(&s);
    html(
        StatusCode::OK,
        html::page(
            "Nodes and GPUs",
            Some(&v),
            30,
            &pages::nodes(&ns, &leases, operator.then_some(s.csrf.as_str())),
        ),
    )
}

async fn usage_page(State(app): State<App>, headers: HeaderMap) -> Response {
    let s = logged_in!(app, headers);
    let who = Who::User(s.user.clone());
    let api = Api(app.server.clone());
    let until = now() as i64;
    let req = pb::UsageRequest {
        by: "team".into(),
        since_unix: until - 30 * 86_400,
        until_unix: until,
        per: "day".into(),
    };
    let u = match pb::org_server::Org::usage(&api, as_who(&who, req)).await {
        Ok(r) => r.into_inner(),
        Err(e) => return refused(&s, &e),
    };
    let v = viewer(&s);
    html(
        StatusCode::OK,
        html::page("Usage over 30 days", Some(&v), 0, &pages::usage(&u, "team")),
    )
}

async fn login_page(State(app): State<App>) -> Response {
    login_form(&app, StatusCode::OK, None)
}

/// The login form with a fresh login secret (cookie and hidden field alike).
fn login_form(app: &App, status: StatusCode, error: Option<&str>) -> Response {
    let secret = match allot_auth::new_secret("login") {
        Ok(s) => s,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("no randomness: {e}\n"),
            )
                .into_response()
        }
    };
    let mut r = html(
        status,
        html::page("Log in", None, 0, &pages::login(&secret, error)),
    );
    set_cookie(&mut r, app.names.login, &secret, 900, app.secure);
    r
}

/// The login form's fields.
#[derive(serde::Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
}

async fn login(
    State(app): State<App>,
    peer: Option<axum::Extension<allot_common::http::Peer>>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let at = now();
    let from = peer.map(|p| p.0 .0.ip());
    if let Some(wait) = from.and_then(|ip| app.logins.wait(ip, at)) {
        let mut r = login_form(
            &app,
            StatusCode::TOO_MANY_REQUESTS,
            Some(&format!(
                "{LOGIN_TRIES} failed logins from this address within a minute; try again in {wait} s"
            )),
        );
        if let Ok(v) = HeaderValue::from_str(&wait.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let shown = cookie(&headers, app.names.login).unwrap_or("");
    if shown.is_empty()
        || !allot_auth::same_hash(
            &allot_auth::hash_secret(shown),
            &allot_auth::hash_secret(&f.csrf),
        )
    {
        return login_form(
            &app,
            StatusCode::FORBIDDEN,
            Some("this login form expired or did not come from allotd; log in again"),
        );
    }
    let found = app
        .server
        .core()
        .alloc
        .creds
        .token_of(f.token.trim(), at)
        .map(|t| (t.user.clone(), t.id.clone(), t.expires));
    let (user, token_id, expires) = match found {
        Ok(t) => t,
        Err(why) => {
            tracing::info!(why = %why, peer = ?from, "web login refused");
            if let Some(ip) = from {
                app.logins.failed(ip, at);
            }
            return login_form(&app, StatusCode::UNAUTHORIZED, Some(&why.0));
        }
    };
    // Whatever session the browser brought (one another page may have tossed in)
    // ends here: a login always starts a fresh one.
    if let Some(old) = cookie(&headers, app.names.session) {
        app.sessions.close(old);
    }
    let (id, _) = match app.sessions.open(&user, &token_id, expires, at) {
        Ok(s) => s,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    };
    tracing::info!(user = %user, token = %token_id, "web login");
    let mut r = see_other("/");
    set_cookie(
        &mut r,
        app.names.session,
        &id,
        expires
            .saturating_sub(at)
            .min(app.server.cfg.server.web_session),
        app.secure,
    );
    set_cookie(&mut r, app.names.login, "", 0, app.secure);
    r
}

async fn logout(State(app): State<App>, headers: HeaderMap, Form(f): Form<ActionForm>) -> Response {
    let s = logged_in!(app, headers);
    if !csrf_ok(&s, &f.csrf) {
        return csrf_refused(&s);
    }
    if let Some(id) = cookie(&headers, app.names.session) {
        app.sessions.close(id);
    }
    let mut r = see_other("/login");
    set_cookie(&mut r, app.names.session, "", 0, app.secure);
    r
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut r = body.into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=300"),
    );
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

async fn css() -> Response {
    asset(include_str!("allot.css"), "text/css; charset=utf-8")
}

async fn js() -> Response {
    asset(include_str!("allot.js"), "text/javascript; charset=utf-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_tls_the_cookies_are_host_only_and_secure() {
        let mut r = StatusCode::OK.into_response();
        set_cookie(&mut r, TLS_NAMES.session, "allot-web_x", 60, true);
        let c = r.headers()[header::SET_COOKIE].to_str().expect("ascii");
        assert_eq!(
            c,
            "__Host-allot_session=allot-web_x; Path=/; Max-Age=60; HttpOnly; SameSite=Strict; Secure"
        );
        assert!(TLS_NAMES.login.starts_with("__Host-"));
    }

    #[test]
    fn a_post_is_cross_origin_by_what_the_browser_says() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        let host = ("host", "127.0.0.1:9470");
        assert_eq!(cross_origin(&h(&[host])), None, "not a browser");
        assert_eq!(
            cross_origin(&h(&[
                host,
                ("origin", "http://127.0.0.1:9470"),
                ("sec-fetch-site", "same-origin")
            ])),
            None
        );
        // The pages' no-referrer policy: a browser's own POST says Origin null.
        assert_eq!(
            cross_origin(&h(&[
                host,
                ("origin", "null"),
                ("sec-fetch-site", "same-origin")
            ])),
            None
        );
        for bad in [
            h(&[host, ("origin", "http://127.0.0.1:8888")]),
            h(&[host, ("origin", "null")]),
            h(&[host, ("sec-fetch-site", "same-site")]),
            h(&[("origin", "http://127.0.0.1:9470")]),
        ] {
            assert!(cross_origin(&bad).is_some(), "{bad:?}");
        }
    }
}
