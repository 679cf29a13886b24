//! Typed plugin options (feature `options`): the JSON object a request passes as `options`,
//! deserialised into the author's own struct, with errors that name the field.
//!
//! ```
//! use dspark_guest::options::parse;
//!
//! #[derive(Debug, serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Options {
//!     #[serde(default = "default_max_len")]
//!     max_len: u8,
//! }
//! fn default_max_len() -> u8 { 12 }
//!
//! assert_eq!(parse::<Options>("").unwrap().max_len, 12);
//! assert_eq!(parse::<Options>(r#"{"max_len": 3}"#).unwrap().max_len, 3);
//! let e = parse::<Options>(r#"{"max_len": "three"}"#).unwrap_err();
//! assert_eq!(e.location.as_deref(), Some("max_len"));
//! assert!(e.message.starts_with("options.max_len: invalid type: string \"three\", expected u8"), "{}", e.message);
//! ```

use serde::de::DeserializeOwned;

use crate::error::{ConstraintError, ErrorCode};

/// Deserialises `options` (a JSON object's text; empty means `{}`) into `T`. An error is
/// `invalid-options`, located at the dotted path of the field that failed (`max_len`,
/// `units.0`), so the client's 400 says which option is wrong and why.
pub fn parse<T: DeserializeOwned>(options: &str) -> Result<T, ConstraintError> {
    let text = if options.trim().is_empty() { "{}" } else { options };
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ConstraintError::new(ErrorCode::InvalidOptions, format!("options: {inner}"))
        } else {
            ConstraintError::new(ErrorCode::InvalidOptions, format!("options.{path}: {inner}")).at(path)
        }
    })?;
    de.end().map_err(|e| ConstraintError::new(ErrorCode::InvalidOptions, format!("options: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::parse;
    use crate::ErrorCode;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Options {
        #[serde(default)]
        units: Vec<String>,
        #[serde(default)]
        strict: bool,
    }

    #[test]
    fn fields_are_typed_and_errors_name_them() {
        assert_eq!(parse::<Options>(" ").unwrap(), Options { units: vec![], strict: false });
        let o = parse::<Options>(r#"{"units": ["Y", "M"], "strict": true}"#).unwrap();
        assert_eq!(o, Options { units: vec!["Y".into(), "M".into()], strict: true });

        let e = parse::<Options>(r#"{"units": ["Y", 3]}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        assert_eq!(e.location.as_deref(), Some("units[1]"));
        assert!(
            e.message.starts_with("options.units[1]: invalid type: integer `3`, expected a string"),
            "{}",
            e.message
        );

        let e = parse::<Options>(r#"{"unit": []}"#).unwrap_err();
        assert!(e.message.contains("unknown field `unit`, expected `units` or `strict`"), "{}", e.message);

        let e = parse::<Options>(r#"{"strict": true} trailing"#).unwrap_err();
        assert!(e.message.starts_with("options: trailing characters"), "{}", e.message);
        assert_eq!(e.location, None);
    }
}
