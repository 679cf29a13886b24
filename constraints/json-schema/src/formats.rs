//! `format` values as patterns over the string's characters (full match). The second field
//! says whether the pattern is exact (`true`) or an approximation (a warning is given).

/// A calendar date: days per month, and 29 February only in leap years.
const DATE: &str = concat!(
    r"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))",
    r"|([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)"
);
/// A time of day with an offset. Leap seconds (`:60`) are not generated.
const TIME: &str = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
/// A character of an RFC 5322 `atext`: the dot-atom of an address's local part is runs of
/// these joined by single dots.
const ATEXT: &str = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]";
const LABEL: &str = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
/// A hostname label as [`LABEL`], without `-` in both its third and fourth place: such labels
/// are reserved for IDNA (`xn--` and a valid Punycode payload, which a pattern cannot check),
/// so none is written.
const STRICT_LABEL: &str = r"[A-Za-z0-9]([A-Za-z0-9]|[A-Za-z0-9-][A-Za-z0-9]|[A-Za-z0-9-]{2}[A-Za-z0-9]|[A-Za-z0-9-]([A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]{0,58}[A-Za-z0-9])?";
const OCTET: &str = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";

/// IPv6 text forms (RFC 4291 section 2.2, RFC 3986's `IPv6address`): eight groups, a `::` for
/// one or more zero groups, an IPv4 address in the last 32 bits.
const IPV6: &str = concat!(
    r"(([0-9A-Fa-f]{1,4}:){6}(LS32)",
    r"|::([0-9A-Fa-f]{1,4}:){5}(LS32)",
    r"|([0-9A-Fa-f]{1,4})?::([0-9A-Fa-f]{1,4}:){4}(LS32)",
    r"|(([0-9A-Fa-f]{1,4}:){0,1}[0-9A-Fa-f]{1,4})?::([0-9A-Fa-f]{1,4}:){3}(LS32)",
    r"|(([0-9A-Fa-f]{1,4}:){0,2}[0-9A-Fa-f]{1,4})?::([0-9A-Fa-f]{1,4}:){2}(LS32)",
    r"|(([0-9A-Fa-f]{1,4}:){0,3}[0-9A-Fa-f]{1,4})?::[0-9A-Fa-f]{1,4}:(LS32)",
    r"|(([0-9A-Fa-f]{1,4}:){0,4}[0-9A-Fa-f]{1,4})?::(LS32)",
    r"|(([0-9A-Fa-f]{1,4}:){0,5}[0-9A-Fa-f]{1,4})?::[0-9A-Fa-f]{1,4}",
    r"|(([0-9A-Fa-f]{1,4}:){0,6}[0-9A-Fa-f]{1,4})?::)",
);

/// The pieces of RFC 3986 (section 3 and appendix A), as character classes: `REG` is
/// `unreserved` and `sub-delims`; a percent-encoding may stand for any character.
const PCT: &str = r"%[0-9A-Fa-f]{2}";
const REG: &str = r"[A-Za-z0-9\-._~!$&'()*+,;=]";

fn ipv6() -> String {
    IPV6.replace("LS32", &format!(r"[0-9A-Fa-f]{{1,4}}:[0-9A-Fa-f]{{1,4}}|({OCTET}\.){{3}}{OCTET}"))
}

/// `uri` (`absolute`) or `uri-reference`, exactly as RFC 3986 parses them: `scheme ":"
/// hier-part` or a relative reference (whose first segment has no `:`), then `?query` and
/// `#fragment`.
fn uri(absolute: bool) -> String {
    let path_char = format!("({REG}|[:@/]|{PCT})");
    let segment_char = format!("({REG}|[:@]|{PCT})");
    let query = format!(r"(\?({REG}|[:@/?]|{PCT})*)?(#({REG}|[:@/?]|{PCT})*)?");
    let ip_literal = format!(r"\[({}|v[0-9A-Fa-f]+\.({REG}|:)+)\]", ipv6());
    let authority = format!(r"(({REG}|:|{PCT})*@)?(({REG}|{PCT})*|{ip_literal})(:[0-9]*)?");
    let after_authority = format!("(/{path_char}*)?");
    // A path that does not start with `//` (that would be an authority).
    let rootless_or_absolute = format!("(/({segment_char}{path_char}*)?|{segment_char}{path_char}*)?");
    let absolute_uri =
        format!(r"[A-Za-z][A-Za-z0-9+.\-]*:(//{authority}{after_authority}|{rootless_or_absolute}){query}");
    if absolute {
        return absolute_uri;
    }
    let no_colon_first = format!("({REG}|@|{PCT})");
    let relative = format!(
        "(//{authority}{after_authority}|/({segment_char}{path_char}*)?|{no_colon_first}+(/{path_char}*)?|){query}"
    );
    format!("{absolute_uri}|{relative}")
}

/// Group nesting the `regex` format's pattern follows; deeper groups are not written.
pub const REGEX_DEPTH: usize = 8;

/// ECMA-262 regular expression syntax (Unicode mode, as the `jsonschema` crate checks it),
/// with groups at most [`REGEX_DEPTH`] deep (nesting is not a regular language; a bound
/// makes it one). Written: pattern characters (not `^$\.*+?()[]{}|`), `.`, escapes
/// (character classes, controls, `\x`, `\u`, `\u{..}`, `\p{..}`, escaped syntax
/// characters), character classes (in a class everything but `]` and `\` is plain; the same
/// escapes and `\b`, `\-`), groups (`(?:`, `(?<name>`, lookarounds) and the assertions `^`,
/// `$`, `\b`, `\B`; a quantifier (`*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}`, then an optional
/// `?`) only after an atom or a group. Not checked: class ranges in order, `n <= m`, group
/// names unique, a quantified lookaround, `\0` before a digit. Never written: back
/// references (they need the group count).
fn regex_syntax() -> String {
    let hex = "[0-9A-Fa-f]";
    let common = format!(
        r"c[A-Za-z]|x{hex}{{2}}|u{hex}{{4}}|u\{{{hex}+\}}|[pP]\{{[A-Za-z_=]+\}}|[\^$\\.*+?()\[\]{{}}|/]|[dDwWsSfnrtv0]"
    );
    let escape = format!(r"\\(?:{common})");
    let class = format!(r"\[\^?(?:[^\]\\]|\\(?:{common}|[b\-]))*\]");
    let plain = r"[^\^$\\.*+?()\[\]{}|]";
    let quantifier = r"(?:[*+?]|\{[0-9]+(?:,[0-9]*)?\})\??";
    let assertion = r"\^|\$|\\[bB]";
    let group_prefix = r"\?:|\?<[A-Za-z_$][A-Za-z0-9_$]*>|\?=|\?!|\?<=|\?<!";
    let term = |group: &str| format!(r"(?:{plain}|\.|{escape}|{class}{group})(?:{quantifier})?|{assertion}|\|");
    let mut disjunction = format!("(?:{})*", term(""));
    for _ in 0..REGEX_DEPTH {
        let group = format!(r"|\((?:{group_prefix})?{disjunction}\)");
        disjunction = format!("(?:{})*", term(&group));
    }
    disjunction
}

/// The most characters a value of `format` has (`u32::MAX`: no limit).
pub fn max_len(format: &str) -> u32 {
    match format {
        "hostname" => 253,
        _ => u32::MAX,
    }
}

/// What an approximated format's pattern does not do, for its warning.
pub fn approximation(format: &str) -> &'static str {
    match format {
        "hostname" => "strictly: IDNA labels (`xn--` and Punycode) are not written, all others are",
        "email" => "by a pattern: a dot-atom local part, a hostname domain (no quoted or IP forms)",
        "regex" => {
            "by its syntax, with groups at most 8 deep and no back references (not written); class \
             ranges, quantifier bounds, duplicate group names and quantified lookarounds are not \
             checked"
        }
        _ => "by a pattern",
    }
}

/// Whether the pattern of an approximated format admits strings the format rejects (strict
/// mode refuses those); `hostname` and `email` only leave valid forms out.
pub fn approximation_admits_more(format: &str) -> bool {
    !matches!(format, "hostname" | "email")
}

/// The pattern of a known format, or `None`.
pub fn pattern(format: &str) -> Option<(String, bool)> {
    Some(match format {
        "date" => (DATE.to_string(), true),
        "time" => (TIME.to_string(), true),
        "date-time" => (format!("({DATE})[Tt]{TIME}"), true),
        "uuid" => ("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}".to_string(), true),
        "ipv4" => (format!(r"({OCTET}\.){{3}}{OCTET}"), true),
        "hostname" => (format!(r"{STRICT_LABEL}(\.{STRICT_LABEL})*"), false),
        "email" => (format!(r"{ATEXT}+(\.{ATEXT}+)*@{LABEL}(\.{LABEL})*"), false),
        "duration" => (
            // RFC 3339 appendix A: a year takes an optional month, which takes an optional
            // day (so no year and day without the month); likewise hours, minutes, seconds.
            r"P([0-9]+W|([0-9]+Y([0-9]+M([0-9]+D)?)?|[0-9]+M([0-9]+D)?|[0-9]+D)(T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S))?|T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S))"
                .to_string(),
            true,
        ),
        "ipv6" => (ipv6(), true),
        "uri" => (uri(true), true),
        "uri-reference" => (uri(false), true),
        "iri-reference" | "uri-template" => (r"[^\s<>\x22{}|\\^`]*".to_string(), false),
        "iri" => (r"[A-Za-z][A-Za-z0-9+.-]*:[^\s<>\x22]*".to_string(), false),
        "json-pointer" => (r"(/([^~/]|~[01])*)*".to_string(), true),
        "regex" => (regex_syntax(), false),
        _ => return None,
    })
}
