//! openraft's storage conformance suite, run against our sled log and state-machine stores.

use baton_node::store::{self, LogStore, StateMachineStore};
use baton_node::types::{StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for SledBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("a temporary directory for the store");
        let (log, sm) = store::open(dir.path())?;
        Ok((dir, log, sm))
    }
}

#[test]
fn sled_stores_pass_openraft_conformance_suite() -> Result<(), StorageError> {
    Suite::test_all(SledBuilder)
}
