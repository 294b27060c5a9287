//! The process's notable events (the local serve in use, machines a sweep deleted), published
//! for whoever listens: each MCP session forwards them to its client as log messages
//! (`crate::protocol::server::notify`). The backend only publishes; it knows nothing of sessions.

use serde_json::{Map, Value};

/// How many events a slow listener may fall behind before it misses some. Events are rare (a
/// handful per process), so this is only a bound.
const BACKLOG: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventLevel {
    Info,
    Warning,
}

/// One notable event: what a person reads, and the same facts as fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerEvent {
    pub level: EventLevel,
    /// A stable word for the kind of event (`localServeStarted`, `orphansDeleted`, ...).
    pub event: &'static str,
    pub message: String,
    pub fields: Map<String, Value>,
}

impl ServerEvent {
    pub fn info(event: &'static str, message: impl Into<String>) -> Self {
        ServerEvent {
            level: EventLevel::Info,
            event,
            message: message.into(),
            fields: Map::new(),
        }
    }

    pub fn warning(event: &'static str, message: impl Into<String>) -> Self {
        ServerEvent {
            level: EventLevel::Warning,
            ..ServerEvent::info(event, message)
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.to_owned(), value.into());
        self
    }

    /// The machine the event is about (its `fleet` and `machine` fields), if it is about one:
    /// with sign-in, only the user who holds it hears of it.
    pub fn machine(&self) -> Option<(&str, &str)> {
        let fleet = self.fields.get("fleet")?.as_str()?;
        let machine = self.fields.get("machine")?.as_str()?;
        Some((fleet, machine))
    }

    /// The `data` of the log message: the message and the event's word first, then its fields.
    pub fn data(&self) -> Value {
        let mut data = Map::new();
        data.insert("event".into(), Value::from(self.event));
        data.insert("message".into(), Value::from(self.message.clone()));
        data.extend(self.fields.clone());
        Value::Object(data)
    }
}

/// A broadcast channel: publishing never waits and never fails, whether anyone listens or not.
#[derive(Clone)]
pub struct Events {
    sender: tokio::sync::broadcast::Sender<ServerEvent>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            sender: tokio::sync::broadcast::Sender::new(BACKLOG),
        }
    }
}

impl Events {
    pub fn publish(&self, event: ServerEvent) {
        // An error only means that no session listens right now.
        let _ = self.sender.send(event);
    }

    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<ServerEvent> {
        self.sender.subscribe()
    }
}
