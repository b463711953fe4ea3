//! What an op call may use beyond its input column and literal parameters: the op
//! declares a [`Need`]; whoever runs the call provides it through [`Resources`].

use std::sync::Arc;

use tokenizers::Tokenizer;

/// A resource an op call needs beyond its input column and literal parameters, declared by
/// the op ([`crate::Op::needs`]) so that no caller has to know which ops need what.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Need {
    /// A tokenizer by dataset name; `None`: the dataset being read.
    Tokenizer(Option<String>),
}

/// Named resources that ops may need beyond their literal parameters.
pub trait Resources: Send + Sync + std::fmt::Debug {
    /// The tokenizer called `name`, or the default one (the dataset being read) for `None`.
    fn tokenizer(&self, name: Option<&str>) -> std::result::Result<Arc<Tokenizer>, String>;
}

/// No resources: ops that need one fail with a clear error.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoResources;

impl Resources for NoResources {
    fn tokenizer(&self, name: Option<&str>) -> std::result::Result<Arc<Tokenizer>, String> {
        Err(match name {
            Some(n) => format!("no tokenizer named '{n}' is available here"),
            None => "no tokenizer is available here".to_owned(),
        })
    }
}
