//! A store that keeps nothing: what a policy built without one (a test's, a tool that only
//! reads the catalog) holds. Writes go nowhere; whatever a limit asks of it is refused as
//! [`StoreUnavailable::Off`], so that a limit built on it refuses rather than lets through.

use super::api::{
    EgressGrantRepository, JobRepository, KeyRepository, RunRepository, SpendRepository, Store,
    StoreUnavailable, TaskRepository,
};
use super::records::{
    EgressGrant, JobEnd, JobRecord, KeyClaim, KeyRecord, NewRun, RunDetail, RunEnd, RunPage,
    ServedEngine, SpendReading, StoredJob, TaskRecord,
};
use crate::fleet::FleetKind;

#[derive(Debug, Default, Clone, Copy)]
pub struct NoStore;

impl Store for NoStore {
    fn runs(&self) -> &dyn RunRepository {
        self
    }
    fn jobs(&self) -> &dyn JobRepository {
        self
    }
    fn tasks(&self) -> &dyn TaskRepository {
        self
    }
    fn egress_grants(&self) -> &dyn EgressGrantRepository {
        self
    }
    fn spend(&self) -> &dyn SpendRepository {
        self
    }
    fn keys(&self) -> &dyn KeyRepository {
        self
    }
    fn owners(&self) -> &dyn crate::store::OwnerRepository {
        self
    }
    fn dropped(&self) -> u64 {
        0
    }
    fn flush(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[async_trait::async_trait]
impl RunRepository for NoStore {
    fn begin(&self, _: NewRun) -> Result<i64, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
    fn end(&self, _: RunEnd) {}
    fn cost(&self, _: i64, _: String) {}
    async fn page(&self, _: Option<i64>, _: usize, _: &str) -> Result<RunPage, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
    async fn get(&self, _: i64, _: &str) -> Result<Option<RunDetail>, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
}

#[async_trait::async_trait]
impl JobRepository for NoStore {
    fn started(&self, _: JobRecord) {}
    fn ended(&self, _: JobEnd) {}
    fn let_go(&self, _: &str) {}
    async fn take_over(&self, _: Vec<ServedEngine>) -> Vec<JobRecord> {
        Vec::new()
    }
    async fn get(&self, _: &str) -> Result<Option<StoredJob>, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
    async fn others(&self, _: usize) -> Result<Vec<StoredJob>, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
}

#[async_trait::async_trait]
impl TaskRepository for NoStore {
    fn created(&self, _: TaskRecord) {}
    fn ended(&self, _: &str, _: &'static str) {}
    async fn get(&self, _: &str) -> Result<Option<TaskRecord>, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
}

#[async_trait::async_trait]
impl EgressGrantRepository for NoStore {
    fn add(&self, _: EgressGrant) {}
    async fn for_machine(
        &self,
        _: FleetKind,
        _: &str,
        _: &str,
    ) -> Result<Vec<String>, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
}

#[async_trait::async_trait]
impl SpendRepository for NoStore {
    async fn day_mark(&self, _: SpendReading) -> Result<i64, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
}

#[async_trait::async_trait]
impl KeyRepository for NoStore {
    async fn claim(&self, _: KeyRecord) -> Result<KeyClaim, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
    fn answered(&self, _: &str, _: String) {}
    fn released(&self, _: &str) {}
    async fn get(&self, _: &str) -> Result<Option<KeyRecord>, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
}

/// Without a store no user can hold a machine: sign-in needs one (the operator's machines need
/// none, and reading who holds one answers the operator).
#[async_trait::async_trait]
impl crate::store::OwnerRepository for NoStore {
    async fn claim(
        &self,
        _: FleetKind,
        _: &str,
        _: &str,
        _: i64,
    ) -> Result<crate::store::MachineClaim, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
    async fn made(&self, _: FleetKind, _: &str, _: &str) -> Result<(), StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
    async fn alias(&self, _: FleetKind, _: &str, _: &str, _: &str) -> Result<(), StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
    async fn holder(&self, _: FleetKind, _: &str) -> Result<Option<String>, StoreUnavailable> {
        Ok(None)
    }
    async fn held(&self, _: FleetKind) -> Result<Vec<(String, String)>, StoreUnavailable> {
        Ok(Vec::new())
    }
    async fn release(&self, _: FleetKind, _: &str, _: &str) -> Result<(), StoreUnavailable> {
        Ok(())
    }
    async fn held_since(
        &self,
        _: FleetKind,
    ) -> Result<Vec<crate::store::Holding>, StoreUnavailable> {
        Ok(Vec::new())
    }
    async fn forget(&self, _: FleetKind, _: &str) -> Result<(), StoreUnavailable> {
        Ok(())
    }
    async fn settle(&self, _: &str, _: &str, _: i64) -> Result<(), StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
    async fn settled(&self, _: &str, _: &str) -> Result<i64, StoreUnavailable> {
        Err(StoreUnavailable::Off)
    }
}
