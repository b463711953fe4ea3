//! Tokenizers that no dataset ships: those trainers give (kept by their content id,
//! `sha256:…`, [`pushdown_ops::tokenizer_id`]) and a server-side folder of them by name
//! (`--tokenizers DIR`: `DIR/NAME.json`). A call's tokenizer name is looked up in the
//! datasets first (`udf.rs`), then here.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use tokenizers::Tokenizer;

/// Tokenizers given by trainers kept at once; the least recently used goes first.
pub const MAX_GIVEN: usize = 8;

/// The largest `tokenizer.json` a trainer may give (Llama 3's is 9 MB).
pub const MAX_GIVEN_BYTES: usize = 64 << 20;

/// The tokenizers of a server that are not a dataset's.
#[derive(Debug, Default)]
pub struct TokenizerCatalog {
    folder: Option<PathBuf>,
    /// Given tokenizers by id, the most recently used last.
    given: Mutex<Vec<(String, Arc<Tokenizer>)>>,
    /// The folder's tokenizers read so far, by name.
    named: Mutex<Vec<(String, Arc<Tokenizer>)>>,
}

impl TokenizerCatalog {
    /// A catalog of the tokenizers in `folder` (none: only those trainers give).
    pub fn new(folder: Option<PathBuf>) -> Self {
        Self {
            folder,
            ..Self::default()
        }
    }

    /// Keeps a trainer's `tokenizer.json` and returns its id; an unreadable file is refused
    /// with the parser's reason.
    pub fn give(&self, json: &[u8]) -> Result<String, String> {
        if json.len() > MAX_GIVEN_BYTES {
            return Err(format!(
                "a tokenizer of {} bytes is over the {MAX_GIVEN_BYTES} a server keeps",
                json.len()
            ));
        }
        let id = pushdown_ops::tokenizer_id(json);
        if self.given(&id).is_some() {
            return Ok(id);
        }
        let tokenizer = Arc::new(pushdown_ops::load_tokenizer(json)?);
        let mut given = self.given.lock();
        given.retain(|(k, _)| *k != id);
        given.push((id.clone(), tokenizer));
        if given.len() > MAX_GIVEN {
            given.remove(0);
        }
        tracing::info!(%id, bytes = json.len(), "a trainer gave a tokenizer");
        Ok(id)
    }

    /// The given tokenizer `id`, if this server holds it.
    pub fn given(&self, id: &str) -> Option<Arc<Tokenizer>> {
        let mut given = self.given.lock();
        let at = given.iter().position(|(k, _)| k == id)?;
        let entry = given.remove(at);
        let tokenizer = Arc::clone(&entry.1);
        given.push(entry);
        Some(tokenizer)
    }

    /// The tokenizer called `name`: a given one by its id, or the folder's `NAME.json`.
    /// `Ok(None)`: there is none by that name; `Err`: there is, but it cannot be read.
    pub fn get(&self, name: &str) -> Result<Option<Arc<Tokenizer>>, String> {
        if name.starts_with(pushdown_ops::TOKENIZER_ID_PREFIX) {
            return Ok(self.given(name));
        }
        let Some(folder) = &self.folder else {
            return Ok(None);
        };
        let plain = !name.is_empty()
            && !name.starts_with('.')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !plain {
            return Ok(None);
        }
        if let Some((_, t)) = self.named.lock().iter().find(|(k, _)| k == name) {
            return Ok(Some(Arc::clone(t)));
        }
        let path = folder.join(format!("{name}.json"));
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let tokenizer =
            Arc::new(pushdown_ops::load_tokenizer(&bytes).map_err(|e| format!("{}: {e}", path.display()))?);
        self.named.lock().push((name.to_owned(), Arc::clone(&tokenizer)));
        Ok(Some(tokenizer))
    }

    /// The names of the folder's tokenizers, for messages.
    pub fn names(&self) -> Vec<String> {
        let Some(folder) = &self.folder else {
            return Vec::new();
        };
        let mut names: Vec<String> = std::fs::read_dir(folder)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".json").map(str::to_owned)
            })
            .collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trained(words: &str) -> String {
        pushdown_ops::train_tokenizer([words].into_iter(), 64).expect("train")
    }

    #[test]
    fn given_tokenizers_are_kept_by_content_and_the_oldest_goes_first() {
        let catalog = TokenizerCatalog::new(None);
        let json = trained("a b c d e f g");
        let id = catalog.give(json.as_bytes()).expect("given");
        assert_eq!(id, pushdown_ops::tokenizer_id(json.as_bytes()));
        assert!(catalog.get(&id).expect("read").is_some());
        assert_eq!(catalog.give(json.as_bytes()).expect("again"), id);
        let e = catalog.give(b"{ not a tokenizer").expect_err("refused");
        assert!(e.contains("invalid tokenizer.json"), "{e}");
        for i in 0..MAX_GIVEN {
            catalog
                .give(trained(&format!("w{i} x{i} y z")).as_bytes())
                .expect("given");
        }
        assert!(catalog.get(&id).expect("read").is_none(), "the oldest went first");
    }

    #[test]
    fn a_folders_tokenizers_are_found_by_name_and_paths_are_not_names() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("small.json"), trained("p q r s")).expect("write");
        std::fs::write(dir.path().join("broken.json"), "{").expect("write");
        let catalog = TokenizerCatalog::new(Some(dir.path().to_owned()));
        assert!(catalog.get("small").expect("read").is_some());
        assert!(catalog.get("missing").expect("read").is_none());
        assert!(catalog.get("../small").expect("read").is_none());
        assert!(
            catalog
                .get("broken")
                .expect_err("unreadable")
                .contains("broken.json")
        );
        assert_eq!(catalog.names(), vec!["broken", "small"]);
    }
}
