//! `format` values as patterns over the string's characters (full match). The second field
//! says whether the pattern is exact (`true`) or an approximation (a warning is given).

/// A calendar date: days per month, and 29 February only in leap years.
const DATE: &str = concat!(
    r"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))",
    r"|([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)"
);
/// A time of day with an offset. Leap seconds (`:60`) are not generated.
const TIME: &str = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
const LABEL: &str = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
const OCTET: &str = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";

/// The pattern of a known format, or `None`.
pub fn pattern(format: &str) -> Option<(String, bool)> {
    Some(match format {
        "date" => (DATE.to_string(), true),
        "time" => (TIME.to_string(), true),
        "date-time" => (format!("({DATE})[Tt]{TIME}"), true),
        "uuid" => ("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}".to_string(), true),
        "ipv4" => (format!(r"({OCTET}\.){{3}}{OCTET}"), true),
        "hostname" => (format!(r"{LABEL}(\.{LABEL})*"), true),
        "email" => (format!(r"[A-Za-z0-9.!#$%&'*+/=?^_`{{|}}~-]+@{LABEL}(\.{LABEL})*"), false),
        "duration" => (
            r"P([0-9]+W|([0-9]+Y([0-9]+M)?([0-9]+D)?|[0-9]+M([0-9]+D)?|[0-9]+D)(T([0-9]+H([0-9]+M)?([0-9]+S)?|[0-9]+M([0-9]+S)?|[0-9]+S))?|T([0-9]+H([0-9]+M)?([0-9]+S)?|[0-9]+M([0-9]+S)?|[0-9]+S))"
                .to_string(),
            true,
        ),
        "ipv6" => (r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*".to_string(), false),
        "uri" => (r"[A-Za-z][A-Za-z0-9+.-]*:[^\s<>\x22{}|\\^`]*".to_string(), false),
        "uri-reference" | "iri-reference" | "uri-template" => (r"[^\s<>\x22{}|\\^`]*".to_string(), false),
        "iri" => (r"[A-Za-z][A-Za-z0-9+.-]*:[^\s<>\x22]*".to_string(), false),
        "json-pointer" => (r"(/([^~/]|~[01])*)*".to_string(), true),
        _ => return None,
    })
}
