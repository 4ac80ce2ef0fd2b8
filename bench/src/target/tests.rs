use super::*;

#[test]
fn delivered_counts() {
    use serde_json::json;
    assert_eq!(delivered(&json!({"ch":"c0","seq":1,"delivered":7})), (7, 0));
    assert_eq!(
        delivered(&json!({"results":[{"delivered":3,"dropped":1},{"delivered":4}]})),
        (7, 1)
    );
    assert_eq!(
        delivered(&json!({"messages":1,"requested":0,"subscribers":12})),
        (12, 0)
    );
    assert_eq!(delivered(&json!({})), (0, 0));
}

#[test]
fn reads_prometheus_samples() {
    let text = "# TYPE herald_frames_sent_total counter\n\
                herald_frames_sent_total{tenant=\"other\"} 5\n\
                herald_frames_sent_total{tenant=\"bench\"} 12345\n\
                herald_frames_sent_total_x{tenant=\"bench\"} 1\n\
                herald_socket_writes_total{tenant=\"bench\"} 678\n";
    assert_eq!(
        metric(text, "herald_frames_sent_total", "bench"),
        Some(12345.0)
    );
    assert_eq!(
        metric(text, "herald_socket_writes_total", "bench"),
        Some(678.0)
    );
    assert_eq!(metric(text, "herald_socket_writes_total", "none"), None);
}
