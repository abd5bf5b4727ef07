//! When to try a request again, and how long to wait first: exponential backoff, unless the
//! endpoint said how long with `Retry-After`.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;

/// Exponential backoff: `initial`, doubled per retry, never more than `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The wait before retry number `retry` (1 for the first retry).
    pub fn delay(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.saturating_sub(1));
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Statuses worth retrying: the endpoint is throttling (429), timed out waiting for us (408),
/// or failed on its side (5xx). Every other 4xx says the request itself is wrong.
pub fn is_retriable_status(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || status.is_server_error()
}

/// Statuses that refuse the connector rather than a record: every request of every record would
/// get them, because the URL, method, credentials, headers or body format the connector is
/// configured with are wrong. Connect's HTTP sink users expect such an answer to fail the task
/// (it is not a bad record to dead-letter), and the task's restart to pick up the fix:
///
/// - 401 Unauthorized, 407 Proxy Authentication Required: missing or expired credentials;
/// - 403 Forbidden: the credentials may not write here;
/// - 404 Not Found, 410 Gone: wrong `http.url`;
/// - 405 Method Not Allowed: wrong `http.method`;
/// - 415 Unsupported Media Type: `batch.format` (the content type) is not accepted;
/// - 421 Misdirected Request, 426 Upgrade Required: the URL's host or scheme is wrong;
/// - a redirect (3xx) that was not followed: the endpoint moved.
///
/// Other 4xx (400, 409, 413, 422, ...) are about the request's content: the records' fault.
pub fn refuses_the_configuration(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        401 | 403 | 404 | 405 | 407 | 410 | 415 | 421 | 426
    ) || status.is_redirection()
}

/// A `Retry-After` value (delay-seconds or an HTTP date) as a wait from `now`.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
        };
        let waits: Vec<u128> = (1..=6).map(|r| backoff.delay(r).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.delay(200), Duration::from_millis(1000));
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn credentials_url_method_and_format_refusals_are_the_configurations_fault() {
        for status in [301, 302, 307, 401, 403, 404, 405, 407, 410, 415, 421, 426] {
            let status = StatusCode::from_u16(status).expect("valid");
            assert!(refuses_the_configuration(status), "{status}");
            assert!(!is_retriable_status(status), "{status}");
        }
        for status in [400, 409, 413, 422, 429, 408, 500, 503] {
            let status = StatusCode::from_u16(status).expect("valid");
            assert!(!refuses_the_configuration(status), "{status}");
        }
    }

    #[test]
    fn throttling_timeouts_and_server_errors_are_retried_other_client_errors_not() {
        for status in [429, 408, 500, 502, 503, 504] {
            assert!(
                is_retriable_status(StatusCode::from_u16(status).expect("valid")),
                "{status}"
            );
        }
        for status in [400, 401, 403, 404, 409, 413, 422] {
            assert!(
                !is_retriable_status(StatusCode::from_u16(status).expect("valid")),
                "{status}"
            );
        }
    }
}
