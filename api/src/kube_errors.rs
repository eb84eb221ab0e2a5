//! Kubernetes client errors as one line a person can act on (feature `client`): the API
//! server's status, or the transport error with its sources, secret environment values of an
//! exec plugin redacted. Shared by the agent and the controller: [`describe`], [`error_chain`],
//! [`redact_env`], [`is_refused`].

/// What a redacted value shows.
pub const REDACTED: &str = "***REDACTED***";

/// Replaces the values of secret-looking environment assignments (`NAME="value"` where NAME
/// contains `SECRET`, `TOKEN` or `PASSWORD`) with `***REDACTED***`. kube's exec-plugin errors
/// print the plugin's command with its environment, which holds a service principal's secret.
pub fn redact_env(text: &str) -> String {
    static RE: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(
            r#"\b([A-Z][A-Z0-9_]*(?:SECRET|TOKEN|PASSWORD)[A-Z0-9_]*)=("(?:[^"\\]|\\.)*"|\S+)"#,
        )
        .ok()
    });
    match re {
        Some(re) => re
            .replace_all(text, format!("$1=\"{}\"", REDACTED))
            .into_owned(),
        None => text.to_string(),
    }
}

/// A one-line description of a kube error that names the cause: the API server's status code,
/// reason and message, or the transport error with its sources (secret environment values of
/// an exec plugin redacted).
pub fn describe(e: &kube::Error) -> String {
    redact_env(&match e {
        kube::Error::Api(s) => {
            let mut out = format!("API server answered {}", s.code);
            if !s.reason.is_empty() {
                out.push(' ');
                out.push_str(&s.reason);
            }
            if !s.message.is_empty() {
                out.push_str(": ");
                out.push_str(&s.message);
            }
            out
        }
        other => error_chain(other),
    })
}

/// `e` and its sources, joined by `: ` (repeated messages dropped; secret environment values
/// redacted).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let m = s.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = s.source();
    }
    redact_env(&out)
}

/// Whether a kube error is the API server refusing the identity (401 or 403).
pub fn is_refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 401 || s.code == 403)
}
