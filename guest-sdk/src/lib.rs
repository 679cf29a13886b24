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
//! With the `options` feature, [`options::parse`] deserialises a request's options into the
//! author's own struct, with errors that name the field.
//!
//! With the `automata` feature, [`dfa`] builds the anchored pattern automata every plugin that
//! matches regular expressions uses, with one size cap.
//!
//! `docs/plugins.md` has a tutorial that builds a plugin from nothing.

mod api;
mod bitset;
#[cfg(feature = "automata")]
pub mod dfa;
mod error;
pub mod key;
mod matcher;
#[cfg(feature = "options")]
pub mod options;
mod recognizer;
mod table;
pub mod testing;
mod trie;
mod walk;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod wasm;

pub use api::{CommitResult, CompiledConstraint, Matcher, Plugin};
pub use bitset::{Mask, TokenSet};
pub use error::{ConstraintError, ErrorCode, Warning, check_kind, error_chain, no_options};
pub use matcher::{MAX_FORCED_BYTES, MaskCache, RecognizerConstraint, RecognizerMatcher};
pub use recognizer::Recognizer;
pub use table::{TokenTable, Tokenize, TokenizeFn};
pub use trie::{BYTE_CLASSES, IdSteps, NON_ASCII_CLASSES, TokenTrie, UTF8_WHOLE, Utf8Step, byte_class, class_bytes};
pub use walk::{ClassLoops, MAX_TABLE_STATES, StateTable, Steps, Transitions};

/// Declares and exports a plugin that serves one kind, takes no options and compiles each
/// source into a [`Recognizer`]: the [`Plugin`] implementation every such plugin writes
/// (the kind checked, the options refused unless empty, the recogniser wrapped in a
/// [`RecognizerConstraint`] without warnings), then [`export_plugin!`].
///
/// `$build` is a function `fn(&str) -> Result<R, ConstraintError>` with `R: Recognizer`.
///
/// ```
/// use dspark_guest::{ConstraintError, ErrorCode, Plugin, Recognizer, TokenTable, key};
///
/// /// Only the text `ok`.
/// pub struct Ok2;
/// impl Recognizer for Ok2 {
///     type State = u8;
///     fn start(&self) -> u8 { 0 }
///     fn advance(&self, n: &u8, b: u8) -> Option<u8> { (b"ok".get(*n as usize) == Some(&b)).then_some(n + 1) }
///     fn is_accepting(&self, n: &u8) -> bool { *n == 2 }
///     fn state_key(&self, n: &u8) -> u64 { key::mix(*n as u64, 0x6f6b) }
/// }
/// fn build(source: &str) -> Result<Ok2, ConstraintError> {
///     if source.is_empty() { Ok(Ok2) } else { Err(ConstraintError::new(ErrorCode::InvalidSource, "no source")) }
/// }
/// dspark_guest::recognizer_plugin!(OkPlugin, "ok", build);
///
/// let table = std::sync::Arc::new(TokenTable::byte_level_for_tests(&[]));
/// assert_eq!(OkPlugin.kinds(), vec!["ok".to_string()]);
/// assert!(OkPlugin.compile("ok", "", "{}", &table).is_ok());
/// assert!(OkPlugin.compile("ok", "", r#"{"x": 1}"#, &table).is_err());
/// assert!(OkPlugin.compile("other", "", "", &table).is_err());
/// ```
#[macro_export]
macro_rules! recognizer_plugin {
    ($plugin:ident, $kind:literal, $build:path) => {
        #[doc = concat!("The plugin: serves kind `", $kind, "` (declared by `dspark_guest::recognizer_plugin!`).")]
        #[derive(Default)]
        pub struct $plugin;

        impl $crate::Plugin for $plugin {
            fn kinds(&self) -> ::std::vec::Vec<::std::string::String> {
                ::std::vec![$kind.into()]
            }

            fn compile(
                &self,
                kind: &str,
                source: &str,
                options: &str,
                table: &::std::sync::Arc<$crate::TokenTable>,
            ) -> ::std::result::Result<::std::sync::Arc<dyn $crate::CompiledConstraint>, $crate::ConstraintError> {
                $crate::check_kind(kind, &[$kind])?;
                $crate::no_options(options)?;
                ::std::result::Result::Ok($crate::RecognizerConstraint::new(
                    $build(source)?,
                    table,
                    ::std::vec::Vec::new(),
                ))
            }
        }

        $crate::export_plugin!($plugin);
    };
}

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
