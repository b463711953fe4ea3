//! Named views: SQL projections of datasets, declared once by the platform team and read by
//! every job and tool as if they were datasets.
//!
//! A catalog file (`pushdown serve --catalog FILE`) declares them in TOML:
//!
//! ```toml
//! [[view]]
//! name = "train_thumbs"
//! description = "64-px thumbnails of the training split"
//! sql = "SELECT id, thumbnail(image, 64) AS image, label FROM images WHERE split = 'train'"
//! ```
//!
//! A view's query is a read-only `SELECT` over datasets and views declared before it (so
//! views never form a cycle). It is planned inside each request's own query, over the very
//! tables that request reads: projections and filters on a view reach the Parquet scan
//! beneath it, and a view that maps rows one by one (a projection and filters over one
//! dataset) is sharded by that dataset's row groups like the dataset itself.
//!
//! Access follows the view's name: a token granted `train_thumbs` reads it (and so, through
//! it, the rows and columns of `images` it selects) without being granted `images`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Deserialize;
use xxhash_rust::xxh3::Xxh3;

use crate::catalog::{Dataset, is_identifier};
use crate::error::{Result, ServerError};

/// One view as the catalog file declares it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewDecl {
    pub name: String,
    pub sql: String,
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    #[serde(default)]
    view: Vec<ViewDecl>,
}

/// A declared view, checked.
#[derive(Debug)]
pub struct View {
    pub name: String,
    pub sql: String,
    pub description: Option<String>,
    /// Its place in the file: a view reads only views declared before it.
    pub order: usize,
    /// The datasets it reads, through other views too.
    pub bases: BTreeSet<String>,
    /// Its query, parsed and checked once when the catalog was read (with the names it reads,
    /// datasets and views): requests plan it from this, never from the text.
    pub checked: crate::allow::CheckedQuery,
}

impl View {
    /// A version that changes when the view's text or any dataset beneath it changes.
    pub fn version(&self, datasets: &BTreeMap<String, Arc<Dataset>>) -> String {
        let mut h = Xxh3::new();
        h.update(self.sql.as_bytes());
        for base in &self.bases {
            h.update(base.as_bytes());
            let version = datasets.get(base).map(|d| d.version()).unwrap_or_default();
            h.update(version.as_bytes());
        }
        format!("{:016x}", h.digest())
    }
}

/// The views of a server, by name.
#[derive(Debug, Default)]
pub struct Views {
    views: BTreeMap<String, Arc<View>>,
}

impl Views {
    /// Reads a catalog file.
    pub fn load(path: &std::path::Path) -> std::result::Result<Self, crate::startup::StartupError> {
        use crate::startup::StartupError;
        let text = std::fs::read_to_string(path).map_err(|source| StartupError::Read {
            path: path.to_owned(),
            cause: source,
        })?;
        Self::from_toml(&text).map_err(|source| StartupError::Views {
            path: path.to_owned(),
            cause: Box::new(source),
        })
    }

    /// Parses a catalog file's text.
    pub fn from_toml(text: &str) -> Result<Self> {
        let file: CatalogFile =
            toml::from_str(text).map_err(|e| ServerError::BadRequest(format!("catalog file: {e}")))?;
        Self::new(file.view)
    }

    /// Checks declarations: names are identifiers and unique; each query is one read-only
    /// `SELECT` reading only datasets and views declared before it.
    pub fn new(decls: Vec<ViewDecl>) -> Result<Self> {
        let bad = |name: &str, why: String| ServerError::BadRequest(format!("view `{name}`: {why}"));
        let mut views: BTreeMap<String, Arc<View>> = BTreeMap::new();
        let declared: BTreeSet<&str> = decls.iter().map(|d| d.name.as_str()).collect();
        for (order, decl) in decls.iter().enumerate() {
            if !is_identifier(&decl.name) || decl.name != decl.name.to_ascii_lowercase() {
                return Err(bad(
                    &decl.name,
                    "a view's name is a lower-case identifier ([a-z_][a-z0-9_]*)".into(),
                ));
            }
            if views.contains_key(&decl.name) {
                return Err(bad(&decl.name, "declared twice".into()));
            }
            let checked = crate::allow::check_view(&decl.sql).map_err(|e| bad(&decl.name, e.to_string()))?;
            let mut bases = BTreeSet::new();
            for r in checked.names() {
                match views.get(r) {
                    Some(v) => bases.extend(v.bases.iter().cloned()),
                    None if declared.contains(r.as_str()) => {
                        return Err(bad(
                            &decl.name,
                            format!(
                                "reads view `{r}`, declared after it (or itself): a view reads only views declared before it"
                            ),
                        ));
                    }
                    None => {
                        bases.insert(r.clone());
                    }
                }
            }
            views.insert(
                decl.name.clone(),
                Arc::new(View {
                    name: decl.name.clone(),
                    sql: decl.sql.clone(),
                    description: decl.description.clone(),
                    order,
                    bases,
                    checked,
                }),
            );
        }
        Ok(Self { views })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<View>> {
        self.views.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<View>> {
        self.views.values()
    }

    pub fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    /// The views `names` read, transitively, in declaration order (each after those it reads).
    pub fn closure<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<Arc<View>> {
        let mut found: BTreeMap<usize, Arc<View>> = BTreeMap::new();
        let mut stack: Vec<&str> = names.into_iter().collect();
        while let Some(name) = stack.pop() {
            if let Some(view) = self.views.get(name)
                && found.insert(view.order, Arc::clone(view)).is_none()
            {
                stack.extend(view.checked.names().iter().map(String::as_str));
            }
        }
        found.into_values().collect()
    }

    /// The datasets `name` reads: itself for a dataset, its bases for a view.
    pub fn bases_of(&self, name: &str) -> BTreeSet<String> {
        match self.views.get(name) {
            Some(v) => v.bases.clone(),
            None => BTreeSet::from([name.to_owned()]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_read_datasets_and_earlier_views_only() {
        let views = Views::from_toml(
            r#"
            [[view]]
            name = "train"
            sql = "SELECT id, label FROM images WHERE split = 'train'"
            [[view]]
            name = "small"
            description = "labels under 10"
            sql = "SELECT * FROM train WHERE label < 10"
            "#,
        )
        .unwrap();
        assert_eq!(views.bases_of("small"), BTreeSet::from(["images".to_owned()]));
        let order: Vec<_> = views.closure(["small"]).iter().map(|v| v.name.clone()).collect();
        assert_eq!(order, ["train", "small"]);

        let later = Views::from_toml(
            "[[view]]\nname = \"a\"\nsql = \"SELECT * FROM b\"\n[[view]]\nname = \"b\"\nsql = \"SELECT * FROM images\"",
        )
        .unwrap_err();
        assert!(later.to_string().contains("declared after it"), "{later}");
        let itself = Views::from_toml("[[view]]\nname = \"a\"\nsql = \"SELECT * FROM a\"").unwrap_err();
        assert!(
            itself.to_string().contains("declared after it (or itself)"),
            "{itself}"
        );
    }

    #[test]
    fn bad_declarations_are_named() {
        for (toml, needle) in [
            (
                "[[view]]\nname = \"Bad\"\nsql = \"SELECT 1\"",
                "lower-case identifier",
            ),
            (
                "[[view]]\nname = \"x\"\nsql = \"DROP TABLE images\"",
                "not a SELECT",
            ),
            ("[[view]]\nname = \"x\"\nsql = \"SELECT * FROM\"", "view `x`"),
            (
                "[[view]]\nname = \"x\"\nsql = \"SELECT 1\"\n[[view]]\nname = \"x\"\nsql = \"SELECT 2\"",
                "declared twice",
            ),
            ("[[view]]\nname = \"x\"\nquery = \"SELECT 1\"", "unknown field"),
            (
                "[[view]]\nname = \"x\"\nsql = \"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '/etc'\"",
                "not a SELECT",
            ),
        ] {
            let e = Views::from_toml(toml).unwrap_err().to_string();
            assert!(e.contains(needle), "{toml}: {e}");
        }
    }
}
