//! The relay in a browser: the landing page `/` answers `Accept: text/html`
//! with (`landing.rs`), the live status `/status` and the JSON its script
//! polls, `/status.json` (`status.rs`), and their stylesheet and scripts
//! under `/assets/` (`assets/`). All of it is built into the binary; every
//! page carries a Content-Security-Policy that lets it load these assets
//! and, for the landing page, the configured icon, and nothing else.

mod html;
pub mod landing;
pub mod status;

use std::sync::Arc;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// `server.landing_page` for the relay's own page.
pub const BUILTIN: &str = "builtin";
/// `server.landing_page` for no page: `/` answers a browser one line of
/// plain text.
pub const OFF: &str = "off";
/// Largest custom landing page read.
const MAX_CUSTOM_BYTES: u64 = 1 << 20;

/// What `/` answers a browser, decided at start (`server.landing_page`).
#[derive(Debug, Clone, Default)]
pub enum Landing {
    #[default]
    Builtin,
    Off,
    /// The operator's page, served as read.
    Custom(Arc<str>),
}

impl Landing {
    /// Reads `server.landing_page`: `"builtin"`, `"off"`, or the path of an
    /// HTML file (UTF-8, at most 1 MiB). The error names the key.
    pub fn load(setting: &str) -> Result<Landing, String> {
        match setting {
            BUILTIN => Ok(Landing::Builtin),
            OFF => Ok(Landing::Off),
            "" => Err(
                "server.landing_page must be \"builtin\", \"off\" or the path of an HTML file"
                    .into(),
            ),
            path => {
                let cannot =
                    |e: std::io::Error| format!("server.landing_page: cannot read {path:?}: {e}");
                let len = std::fs::metadata(path).map_err(cannot)?.len();
                if len > MAX_CUSTOM_BYTES {
                    return Err(format!(
                        "server.landing_page: {path:?} is {len} bytes, more than {MAX_CUSTOM_BYTES}"
                    ));
                }
                let text = std::fs::read_to_string(path).map_err(cannot)?;
                Ok(Landing::Custom(text.into()))
            }
        }
    }
}

/// The origin (`https://host:port`) of an http(s) URL, for the policy's
/// `img-src`; `None` for anything else, or for a host with characters a
/// policy could not hold.
pub fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
    if authority.is_empty() || !authority.chars().all(fine) {
        return None;
    }
    Some(format!("{}://{}", scheme.to_ascii_lowercase(), authority))
}

/// The policy of the relay's own pages: scripts, styles and connections to
/// this origin only, images from it and from `icon`'s origin.
pub fn builtin_policy(icon: &str) -> String {
    let img = match origin_of(icon) {
        Some(origin) => format!("'self' {origin}"),
        None => "'self'".into(),
    };
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src {img}; \
         connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
}

/// The policy of an operator's page: its own inline styles, images from
/// anywhere over https, the relay's stylesheet; no script runs.
pub const CUSTOM_POLICY: &str = "default-src 'none'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' https: data:; font-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// An HTML page with its policy.
pub fn html_response(body: impl Into<axum::body::Body>, policy: &str) -> Response {
    let mut resp = (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body.into(),
    )
        .into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(policy) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// `/assets/<name>`: the stylesheet, the two scripts and the tab's icon.
pub fn asset(name: &str) -> Option<Response> {
    let (body, kind): (&'static str, &'static str) = match name {
        "sluice.css" => (include_str!("assets/sluice.css"), "text/css; charset=utf-8"),
        "page.js" => (
            include_str!("assets/page.js"),
            "text/javascript; charset=utf-8",
        ),
        "status.js" => (
            include_str!("assets/status.js"),
            "text/javascript; charset=utf-8",
        ),
        "icon.svg" => (include_str!("assets/icon.svg"), "image/svg+xml"),
        _ => return None,
    };
    let mut resp = ([(header::CONTENT_TYPE, kind)], body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    Some(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_scheme_and_authority_of_an_http_url_only() {
        assert_eq!(
            origin_of("https://img.example.com:8443/a/b.png?x#y").as_deref(),
            Some("https://img.example.com:8443")
        );
        assert_eq!(
            origin_of("HTTP://[::1]:80/i.png").as_deref(),
            Some("http://[::1]:80")
        );
        for bad in [
            "",
            "ftp://example.com/i.png",
            "data:image/png;base64,AA",
            "https:///i.png",
            "https://a.example;script-src *",
            "https://user@example.com/i.png",
            "https://a b/",
            "https://'self'/",
        ] {
            assert_eq!(origin_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_builtin_policy_allows_the_icon_origin_and_nothing_inline() {
        let p = builtin_policy("https://cdn.example/icon.png");
        assert!(p.starts_with("default-src 'none';"), "{p}");
        assert!(p.contains("img-src 'self' https://cdn.example;"), "{p}");
        assert!(!p.contains("unsafe"), "{p}");
        assert!(builtin_policy("").contains("img-src 'self';"));
    }

    #[test]
    fn a_landing_page_setting_is_builtin_off_or_a_readable_file() {
        assert!(matches!(Landing::load("builtin"), Ok(Landing::Builtin)));
        assert!(matches!(Landing::load("off"), Ok(Landing::Off)));
        let err = Landing::load("/nonexistent/page.html").unwrap_err();
        assert!(err.starts_with("server.landing_page: cannot read"), "{err}");
        assert!(
            Landing::load("")
                .unwrap_err()
                .contains("server.landing_page")
        );
    }
}
