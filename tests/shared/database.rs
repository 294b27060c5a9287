//! A database of a test's own on the tests' PostgreSQL server.

use tokio_postgres::NoTls;

/// The server's URL from scripts/postgres.sh; a test without it fails saying how to get one.
pub fn server_url() -> String {
    std::env::var("SMOL_TEST_PG_URL").unwrap_or_else(|_| {
        panic!(
            "SMOL_TEST_PG_URL is not set: start the tests' PostgreSQL with `scripts/postgres.sh up` \
             and `eval \"export $(scripts/postgres.sh env)\"` (scripts/test.sh does both)"
        )
    })
}

/// A fresh, empty database, dropped when this goes (its connections ended first).
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub async fn new() -> TestDatabase {
        let name = format!("smoltest_{:016x}", rand::random::<u64>());
        admin(&format!("CREATE DATABASE {name}")).await;
        let server = server_url();
        let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
        TestDatabase {
            url: format!("{base}/{name}"),
            name,
        }
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Dropped inside a runtime: the drop runs on a thread of its own with one of its own.
        let _ = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(admin(&format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )));
            }
        })
        .join();
    }
}

pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("the tests' PostgreSQL answers");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

async fn admin(statement: &str) {
    connect(&server_url())
        .await
        .batch_execute(statement)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}
