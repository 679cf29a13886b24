//! The component glue (only built for `wasm32`): the WIT bindings and the adapter that exports
//! a [`crate::Plugin`] through them. Plugin authors use [`crate::export_plugin!`] instead.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use crate::api;
use crate::bitset::Mask;
use crate::error;
use crate::table::TokenTable;
use crate::table::Tokenize;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "plugin",
        path: "../wit/0.1.0",
        pub_export_macro: true,
        export_macro_name: "__dspark_export_world",
        default_bindings_module: "dspark_guest::wasm::bindings",
    });
}

use bindings::dspark::constraint::types as wit;
use bindings::exports::dspark::constraint::constraint as exports;

unsafe extern "Rust" {
    /// Defined by `export_plugin!` in the plugin crate.
    safe fn __dspark_guest_plugin() -> &'static dyn api::Plugin;
}

static TABLE: OnceLock<Arc<TokenTable>> = OnceLock::new();

/// Calls the host's canonical tokenizer.
fn host_tokenize(text: &[u8]) -> Vec<u32> {
    bindings::dspark::constraint::host::tokenize(text)
}

fn to_wit_error(e: error::ConstraintError) -> wit::ConstraintError {
    use error::ErrorCode as A;
    use wit::ErrorCode as W;
    let code = match e.code {
        A::InvalidKind => W::InvalidKind,
        A::InvalidSource => W::InvalidSource,
        A::InvalidOptions => W::InvalidOptions,
        A::Unsupported => W::Unsupported,
        A::TooLarge => W::TooLarge,
        A::RejectedToken => W::RejectedToken,
        A::InvalidState => W::InvalidState,
        A::Internal => W::Internal,
    };
    wit::ConstraintError { code, message: e.message, location: e.location }
}

fn to_wit_mask(m: Mask) -> wit::Mask {
    match m {
        Mask::All => wit::Mask::All,
        Mask::Allow(v) => wit::Mask::Allow(v),
        Mask::Ranges(r) => {
            wit::Mask::Ranges(r.into_iter().map(|(start, end)| wit::TokenRange { start, end }).collect())
        }
        Mask::Bitset(w) => wit::Mask::Bitset(w),
    }
}

/// The type the world's exports are implemented on.
#[doc(hidden)]
pub struct Exports;

/// A compiled constraint resource.
#[doc(hidden)]
pub struct CompiledRes(Arc<dyn api::CompiledConstraint>);

/// A matcher resource.
#[doc(hidden)]
pub struct MatcherRes(RefCell<Box<dyn api::Matcher>>);

impl exports::Guest for Exports {
    type Compiled = CompiledRes;
    type Matcher = MatcherRes;

    fn kinds() -> Vec<String> {
        __dspark_guest_plugin().kinds()
    }

    fn init(table: wit::TokenTable) -> Result<(), wit::ConstraintError> {
        if TABLE.get().is_some() {
            return Err(to_wit_error(error::ConstraintError::new(
                error::ErrorCode::InvalidState,
                "init was already called on this instance",
            )));
        }
        // Forced spans are tokenised by the model's own tokenizer, through the host.
        let t = TokenTable::new(table.token_bytes, table.token_offsets, &table.special_tokens, &table.eos_tokens)
            .map_err(to_wit_error)?
            .with_tokenize(Tokenize::Custom(Arc::new(host_tokenize)));
        let _ = TABLE.set(Arc::new(t));
        Ok(())
    }
}

impl exports::GuestCompiled for CompiledRes {
    fn compile(kind: String, source: String, options: String) -> Result<exports::Compiled, wit::ConstraintError> {
        let table = TABLE.get().ok_or_else(|| {
            to_wit_error(error::ConstraintError::new(error::ErrorCode::InvalidState, "compile before init"))
        })?;
        let compiled = __dspark_guest_plugin().compile(&kind, &source, &options, table).map_err(to_wit_error)?;
        Ok(exports::Compiled::new(CompiledRes(compiled)))
    }

    fn warnings(&self) -> Vec<wit::Warning> {
        self.0.warnings().into_iter().map(|w| wit::Warning { location: w.location, message: w.message }).collect()
    }

    fn new_matcher(&self) -> exports::Matcher {
        exports::Matcher::new(MatcherRes(RefCell::new(self.0.new_matcher())))
    }
}

impl exports::GuestMatcher for MatcherRes {
    fn compute_mask(&self) -> Result<wit::Mask, wit::ConstraintError> {
        self.0.borrow_mut().compute_mask().map(to_wit_mask).map_err(to_wit_error)
    }

    fn commit(&self, tokens: Vec<u32>) -> Result<wit::CommitResult, wit::ConstraintError> {
        let r = self.0.borrow_mut().commit(&tokens).map_err(to_wit_error)?;
        Ok(wit::CommitResult { forced: r.forced, stop: r.stop })
    }

    fn rollback(&self, n: u32) -> Result<(), wit::ConstraintError> {
        self.0.borrow_mut().rollback(n).map_err(to_wit_error)
    }

    fn validate_draft(&self, tokens: Vec<u32>) -> u32 {
        self.0.borrow().validate_draft(&tokens)
    }

    fn fork(&self) -> exports::Matcher {
        exports::Matcher::new(MatcherRes(RefCell::new(self.0.borrow().fork())))
    }

    fn is_accepting(&self) -> bool {
        self.0.borrow().is_accepting()
    }

    fn is_stopped(&self) -> bool {
        self.0.borrow().is_stopped()
    }

    fn state_key(&self) -> u64 {
        self.0.borrow().state_key()
    }
}
