//! A session client standing for the user: it answers a machine's egress question (an
//! elicitation form, one yes/no a destination) with yes for the destinations it allows, and
//! keeps every question it was asked.

use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    Implementation,
};
use rmcp::service::RequestContext;
use rmcp::{ClientHandler, ErrorData, RoleClient};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// A session client that says yes to the destinations in `allow` and no to the others, and
/// keeps every question it was asked.
#[derive(Clone)]
pub struct User {
    pub can_be_asked: bool,
    pub allow: Vec<&'static str>,
    pub questions: Arc<Mutex<Vec<Value>>>,
    /// How long the user takes to answer.
    pub thinks: std::time::Duration,
}

impl ClientHandler for User {
    fn get_info(&self) -> ClientConfig {
        let capabilities: ClientCapabilities = if self.can_be_asked {
            serde_json::from_value(json!({"elicitation": {"form": {}}})).unwrap()
        } else {
            ClientCapabilities::default()
        };
        ClientConfig::new(capabilities, Implementation::new("user", "0"))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = request
        else {
            panic!("the egress question is a form")
        };
        let schema = serde_json::to_value(&requested_schema).unwrap();
        self.questions
            .lock()
            .unwrap()
            .push(json!({"message": message, "schema": schema}));
        tokio::time::sleep(self.thinks).await;
        let mut content = serde_json::Map::new();
        for (key, property) in schema["properties"].as_object().unwrap() {
            let host = property["title"].as_str().unwrap();
            content.insert(key.clone(), json!(self.allow.contains(&host)));
        }
        let mut result: ElicitResult = serde_json::from_value(json!({"action": "accept"})).unwrap();
        result.action = ElicitationAction::Accept;
        result.content = Some(Value::Object(content));
        Ok(result)
    }
}

impl User {
    pub fn new(can_be_asked: bool, allow: Vec<&'static str>) -> User {
        User {
            can_be_asked,
            allow,
            questions: Arc::default(),
            thinks: std::time::Duration::ZERO,
        }
    }
}
