//! The address rules (table), and the endpoint over real loopback sockets: routes, the
//! connection limit, the header timeout and a taken address. Nothing is faked.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

#[test]
fn bind_addresses_follow_kubernetes_metrics_bind_addresses() {
    let v4 = |s: &str| s.parse::<SocketAddr>().unwrap();
    let cases: [(&str, Result<Listen, &str>); 11] = [
        ("0", Ok(Listen::Disabled)),
        (" 0 ", Ok(Listen::Disabled)),
        ("127.0.0.1:9469", Ok(Listen::At(vec![v4("127.0.0.1:9469")]))),
        ("[::1]:0", Ok(Listen::At(vec![v4("[::1]:0")]))),
        (
            ":9469",
            Ok(Listen::At(vec![v4("[::]:9469"), v4("0.0.0.0:9469")])),
        ),
        ("localhost:9469", Err("names are not resolved")),
        ("127.0.0.1", Err("is not IP:PORT")),
        ("", Err("is not IP:PORT")),
        (":99999", Err("is not :PORT")),
        (":", Err("is not :PORT")),
        ("127.0.0.1:9469\n--x", Err("is not IP:PORT")),
    ];
    for (input, want) in cases {
        match (parse_address(input), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{input:?}"),
            (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{input:?}: {e}"),
            (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
        }
    }
}

async fn serve(limits: Limits) -> (SocketAddr, Arc<AtomicUsize>, CancellationToken) {
    let endpoint = Endpoint::bind(&["127.0.0.1:0".parse().unwrap()])
        .await
        .unwrap()
        .unwrap();
    let addr = endpoint.local_addr().unwrap();
    let renders = Arc::new(AtomicUsize::new(0));
    let counted = renders.clone();
    let render: Render = Arc::new(move || {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        format!("# TYPE scrapes counter\nscrapes_total {n}\n# EOF\n")
    });
    let shutdown = CancellationToken::new();
    tokio::spawn(endpoint.serve(render, limits, shutdown.clone()));
    (addr, renders, shutdown)
}

/// A raw request; the whole response as text (the server closes after one request).
async fn raw(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn real_endpoint_serves_metrics_on_get_and_head_and_refuses_the_rest() {
    let (addr, renders, shutdown) = serve(Limits::default()).await;
    let get = raw(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(get.starts_with("HTTP/1.1 200"), "{get}");
    assert!(
        get.to_ascii_lowercase()
            .contains(&format!("content-type: {CONTENT_TYPE}")),
        "{get}"
    );
    assert!(
        get.ends_with("\r\n\r\n# TYPE scrapes counter\nscrapes_total 1\n# EOF\n"),
        "{get}"
    );

    let head = raw(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.contains("scrapes_total"), "{head}");

    let post = raw(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
    )
    .await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(
        post.to_ascii_lowercase().contains("allow: get, head"),
        "{post}"
    );

    let other = raw(addr, "GET /debug/pprof HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    // One connection, one request: the server closed after answering (read_to_string ended).
    assert!(
        other.to_ascii_lowercase().contains("connection: close"),
        "{other}"
    );
    // GET and HEAD rendered; POST and 404 did not.
    assert_eq!(renders.load(Ordering::SeqCst), 2);
    shutdown.cancel();
}

#[tokio::test]
async fn real_endpoint_closes_connections_over_its_limit_and_idle_ones_at_the_header_timeout() {
    let limits = Limits {
        max_connections: 1,
        header_read_timeout: Duration::from_millis(300),
        connection_timeout: Duration::from_secs(5),
    };
    let (addr, _renders, shutdown) = serve(limits).await;
    // A client that connects and says nothing holds the only slot...
    let mut idle = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // ...so the next connection is closed unread.
    let mut over = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), over.read(&mut buf))
        .await
        .expect("the connection over the limit is closed at once")
        .unwrap_or(0);
    assert_eq!(n, 0, "nothing is served over the limit");
    // The idle client is dropped at the header timeout, freeing the slot.
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), idle.read_to_end(&mut rest))
        .await
        .expect("the idle connection is closed at the header timeout");
    assert!(started.elapsed() < Duration::from_secs(3));
    let resp = raw(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    shutdown.cancel();
}

#[tokio::test]
async fn an_address_in_use_is_a_warning_and_no_endpoint_not_an_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let render: Render = Arc::new(String::new);
    let got = spawn(
        "test",
        &Listen::At(vec![addr]),
        render.clone(),
        Limits::default(),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(got, None);
    let bound = spawn(
        "test",
        &parse_address("127.0.0.1:0").unwrap(),
        render.clone(),
        Limits::default(),
        CancellationToken::new(),
    )
    .await;
    assert!(bound.is_some_and(|a| a.port() != 0));
    assert_eq!(
        spawn(
            "test",
            &Listen::Disabled,
            render,
            Limits::default(),
            CancellationToken::new()
        )
        .await,
        None
    );
}

#[test]
fn encode_writes_openmetrics_text_with_its_eof() {
    let mut registry = Registry::default();
    let c: prometheus_client::metrics::counter::Counter = Default::default();
    registry.register("things", "Things done", c.clone());
    c.inc();
    let text = encode(&registry);
    assert!(text.contains("# HELP things Things done."), "{text}");
    assert!(text.contains("things_total 1\n"), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
}
