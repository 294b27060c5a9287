//! The MCP Apps views' build and their offer to sessionless (2026-07-28) clients, over HTTP. The
//! views themselves, in a real browser, are tests/guest/apps.rs; the session lifecycle's offer
//! and refusals, tests/offline/apps.rs.

use crate::common::clients::{HttpServer, stateless_request};
use serde_json::{Value, json};

const TOKEN: &str = "views-token";
const UI: &str = "io.modelcontextprotocol/ui";

fn shows_views() -> Value {
    json!({"extensions": {UI: {"mimeTypes": ["text/html;profile=mcp-app"]}}})
}

/// generated/views/*.html are what scripts/views/build.mjs makes of src/protocol/apps/ with the
/// pinned packages: a view changed in its source and not rebuilt fails here.
#[test]
fn the_committed_views_are_their_sources_built() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("node")
        .arg(root.join("scripts/views/build.mjs"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A sessionless client declares the extension in each request's `_meta`: server/discover, the
/// tools, the resources and view-state follow what that request declared.
#[tokio::test]
async fn a_sessionless_client_gets_views_on_the_requests_that_declare_them() {
    let rt = tempfile::tempdir().unwrap();
    let fake = crate::common::fake_serve::FakeServe::start().await;
    let url = fake.url();
    let server = HttpServer::spawn(rt.path(), TOKEN, &[("SMOL_LOCAL_URL", url.as_str())]).await;
    for (capabilities, offered) in [(shows_views(), true), (json!({}), false)] {
        let discovered = stateless_request(
            &server,
            TOKEN,
            "server/discover",
            capabilities.clone(),
            json!({}),
        )
        .await;
        let declares = &discovered["result"]["capabilities"]["extensions"][UI];
        assert_eq!(declares.is_object(), offered, "{discovered}");
        let tools = stateless_request(
            &server,
            TOKEN,
            "tools/list",
            capabilities.clone(),
            json!({}),
        )
        .await;
        let tools = tools["result"]["tools"].as_array().unwrap().clone();
        let view_state = tools.iter().find(|t| t["name"] == "view-state");
        assert_eq!(view_state.is_some(), offered);
        let list = tools.iter().find(|t| t["name"] == "list-machines").unwrap();
        assert_eq!(
            list["_meta"]["ui"]["resourceUri"].as_str(),
            offered.then_some("ui://smol-mcp/machines")
        );
        let read = stateless_request(
            &server,
            TOKEN,
            "resources/read",
            capabilities.clone(),
            json!({"uri": "ui://smol-mcp/egress"}),
        )
        .await;
        if offered {
            assert_eq!(
                read["result"]["contents"][0]["mimeType"], "text/html;profile=mcp-app",
                "{read}"
            );
        } else {
            let message = read["error"]["message"].as_str().unwrap();
            assert!(message.contains(UI), "{read}");
        }
        let called = stateless_request(
            &server,
            TOKEN,
            "tools/call",
            capabilities.clone(),
            json!({"name": "view-state", "arguments": {"view": "egress"}}),
        )
        .await;
        if offered {
            assert_eq!(
                called["result"]["structuredContent"],
                json!({"questions": []}),
                "{called}"
            );
        } else {
            assert_eq!(called["result"]["isError"], true, "{called}");
        }
    }
}

/// What a view shows comes in part from the guest (a destination its program tried to reach,
/// the screen it painted): the views put it in the page only through `text`, which leaves no
/// markup and no quote that could end an attribute (and add an event handler that answers the
/// guest's own egress question).
#[test]
fn what_a_view_shows_cannot_become_markup() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = format!(
        "import {{ text }} from {:?};\n\
         const out = [`a\" onfocus=\"alert(1)`, \"b' x='1\", '<img src=x onerror=1>', '&amp;', null]\n\
           .map(text);\n\
         console.log(JSON.stringify(out));",
        root.join("src/protocol/apps/bridge.js")
            .display()
            .to_string()
    );
    let out = std::process::Command::new("node")
        .args(["--input-type=module", "-e", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let escaped: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        escaped,
        [
            "a&quot; onfocus=&quot;alert(1)",
            "b&#39; x=&#39;1",
            "&lt;img src=x onerror=1&gt;",
            "&amp;amp;",
            ""
        ]
    );
    // Every view takes `text` from the bridge; none writes a value into the page another way.
    for view in ["machines", "egress", "terminal"] {
        let source =
            std::fs::read_to_string(root.join(format!("src/protocol/apps/{view}.js"))).unwrap();
        assert!(
            source.contains("import { connect, text } from './bridge.js';"),
            "{view}"
        );
        assert!(!source.contains("textContent ="), "{view}");
    }
}
