//! The guest SDK for dspark constraint plugins.
//!
//! A plugin is a WebAssembly component (target `wasm32-wasip2`) that implements the contract in
//! `wit/0.1.0/constraint.wit`. With this crate an author:
//!
//! 1. implements [`Plugin`] (kinds served, compile) and, for each compiled constraint, either a
//!    [`Matcher`] directly or, far simpler, a byte-level [`Recognizer`], from which
//!    [`RecognizerConstraint`] derives token masks (by walking the [`TokenTrie`]), canonical
//!    forced spans, rollback, drafts and state keys;
//! 2. exports it with one line, `dspark_guest::export_plugin!(MyPlugin);`;
//! 3. unit-tests the logic natively with `cargo test`, using [`TokenTable::from_tokens`] or
//!    [`TokenTable::byte_level_for_tests`] and the helpers in [`testing`].
//!
//! See the crate's README for a tutorial that builds a plugin from nothing.

mod api;
mod bitset;
pub mod key;
mod recognizer;
mod table;
pub mod testing;
mod trie;
mod walk;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod wasm;

pub use api::{
    CommitResult, CompiledConstraint, ConstraintError, ErrorCode, Mask, Matcher, Plugin, Warning, check_kind,
    error_chain, no_options,
};
pub use bitset::TokenSet;
pub use recognizer::{MAX_FORCED_BYTES, MaskCache, Recognizer, RecognizerConstraint, RecognizerMatcher};
pub use table::{TokenTable, Tokenize, TokenizeFn};
pub use trie::{BYTE_CLASSES, IdSteps, NON_ASCII_CLASSES, TokenTrie, UTF8_WHOLE, Utf8Step, byte_class, class_bytes};
pub use walk::{ClassLoops, MAX_TABLE_STATES, StateTable, Steps, Transitions};

/// Exports a [`Plugin`] type (which must implement `Default`) as the component's
/// `dspark:constraint/constraint` interface. Expands to nothing when not building for wasm,
/// so the plugin crate's native tests link normally.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            #[unsafe(no_mangle)]
            fn __dspark_guest_plugin() -> &'static dyn $crate::Plugin {
                static PLUGIN: ::std::sync::OnceLock<$plugin> = ::std::sync::OnceLock::new();
                PLUGIN.get_or_init(<$plugin as ::core::default::Default>::default)
            }
            use $crate::wasm::Exports;
    $crate::wasm::bindings::__dspark_export_world!(Exports with_types_in $crate::wasm::bindings);
        };
    };
}
