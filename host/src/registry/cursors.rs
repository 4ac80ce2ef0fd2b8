//! This node's stored positions in its tenants' sources: the part of the
//! registry a source reader may read and write (every cursor is keyed by
//! tenant, this node and the source's key; another node's are not in reach).

use super::{Registry, RegistryError};
use std::sync::Arc;

/// The registry's `ingest_cursors`, bound to one node.
#[derive(Clone)]
pub struct CursorStore {
    registry: Registry,
    node: Arc<str>,
}

impl CursorStore {
    pub fn new(registry: Registry, node: &str) -> CursorStore {
        CursorStore {
            registry,
            node: node.into(),
        }
    }

    /// The node whose cursors these are.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The stored position of `tenant`'s source `key`, if any.
    pub async fn get(&self, tenant: &str, key: &str) -> Result<Option<String>, RegistryError> {
        self.registry.cursor(tenant, &self.node, key).await
    }

    pub async fn put(&self, tenant: &str, key: &str, position: &str) -> Result<(), RegistryError> {
        self.registry
            .put_cursor(tenant, &self.node, key, position)
            .await
    }

    /// Deletes every position of `tenant` on this node (the tenant is gone).
    pub async fn forget(&self, tenant: &str) -> Result<(), RegistryError> {
        self.registry.delete_cursors(tenant, &self.node).await
    }
}
