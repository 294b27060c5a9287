//! What the engine's published ports do, seen from this host, on a booted bare machine of the
//! nested 1.32.2 engine: the facts a tool that publishes a service relies on. A port set live
//! on a running machine reaches a service in the guest. Whether the engine accepts a connect
//! before anything listens cannot be seen from here: QEMU's user network, which forwards the
//! port to this host, accepts every connect itself and closes it when the far side refuses.

use crate::common::nested::{nested, rest, serial};
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a connect to `port` on this host's loopback is answered, within 10 s.
async fn answer_at(port: u16) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("connect to {port}: {e}"));
    let _ = stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection to {port} stayed open 10 s");
    got
}

#[tokio::test]
async fn a_port_published_live_reaches_a_service_in_the_guest_from_this_host() {
    let _one_at_a_time = serial().await;
    let engine = nested();
    let port = engine.publish_ports[0];
    let http = rest();
    let base = format!("{}/api/v1/machines", engine.url);
    let machine = format!("ports-{}", std::process::id());
    let created = http
        .post(&base)
        .json(&json!({"name": machine, "cpus": 1, "memoryMb": 256}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 200, "{}", created.text().await.unwrap());
    // A boot that dies under TCG is tried once more, as the booted tests do.
    let mut started = http
        .post(format!("{base}/{machine}/start"))
        .send()
        .await
        .unwrap();
    if started.status() != 200 {
        eprintln!(
            "engine_ports: the start failed ({}); once more",
            started.text().await.unwrap()
        );
        started = http
            .post(format!("{base}/{machine}/start"))
            .send()
            .await
            .unwrap();
    }
    assert_eq!(started.status(), 200, "{}", started.text().await.unwrap());

    let set = http
        .put(format!("{base}/{machine}/ports"))
        .json(&json!({"ports": [{"host": port, "guest": 8000, "protocol": "tcp"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200, "{}", set.text().await.unwrap());
    assert_eq!(
        answer_at(port).await,
        b"",
        "nothing listens in the guest yet, so nothing answers"
    );

    let serve = "nohup sh -c 'while true; do printf \"HTTP/1.0 200 OK\\r\\n\\r\\nhello from the guest\\n\" | nc -l -p 8000; done' >/dev/null 2>&1 </dev/null & \
                 for i in $(seq 50); do netstat -ltn | grep -q ':8000 .*LISTEN' && exit 0; sleep 0.2; done; exit 1";
    let listening = http
        .post(format!("{base}/{machine}/exec"))
        .json(&json!({"command": ["sh", "-c", serve], "timeoutSecs": 60}))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert_eq!(listening["exitCode"], 0, "the guest's service: {listening}");
    let answer = String::from_utf8_lossy(&answer_at(port).await).into_owned();
    assert!(
        answer.starts_with("HTTP/1.0 200 OK") && answer.ends_with("hello from the guest\n"),
        "{answer:?}"
    );

    let deleted = http
        .delete(format!("{base}/{machine}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200, "{}", deleted.text().await.unwrap());
}
