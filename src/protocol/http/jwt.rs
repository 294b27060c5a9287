//! Access tokens as JWTs (RFC 7519, RFC 9068), checked against the issuer's key set (RFC 7517)
//! with ring, already built for rustls: the signature by a key of the set, then the issuer, the
//! audience (this server, RFC 8707), the lifetime and the scopes. Nothing here fetches; the key
//! set is handed in (`signin` fetches and caches it).
//!
//! Why by hand and not the `jsonwebtoken` crate (12.0 when this was weighed): it no longer has
//! a ring backend, only `aws_lc_rs` (a C library built with cmake) or `rust_crypto` (a second
//! crypto stack: `rsa`, `p256`, `p384`, `ed25519-dalek` beside the ring rustls already builds).
//! And it would not do all the checks below: it refuses `crit` as we do, but reads no `typ`,
//! takes any `exp`/`nbf` up to u64::MAX (a token that never expires) with no check of `iat`,
//! has no rule for the user claim, and turns `alg: none` into a generic header parse error
//! rather than a refusal by name. Key selection (kid, alg, kty, crv) would stay ours as well,
//! since it takes one decoding key. What it would take over is the signature calls, a few
//! lines of ring here.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature;
use serde::Deserialize;

/// A token longer than this is refused before it is decoded: a header is the place to make a
/// server hold memory, and no issuer's access token comes near it.
pub(crate) const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Keys a set may hold: an issuer publishes a few (the current, the next, the last).
pub(crate) const MAX_KEYS: usize = 64;

/// Clocks disagree; a token is taken this long past its `exp` or before its `nbf`.
const LEEWAY_SECS: i64 = 60;

/// The latest NumericDate taken, 9999-12-31T23:59:59Z: no issuer means a later one, and the
/// bound keeps every sum with it far from overflow.
const MAX_NUMERIC_DATE: i64 = 253_402_300_799;

/// The longest user id taken, in bytes.
const MAX_USER_BYTES: usize = 256;

/// How the log shows the operator (`User`'s Display): no signed-in user may look like it.
const OPERATOR_SHOWN: &str = "(the operator)";

/// Why a token is refused. The text goes back to the client as `error_description`, so it
/// names what was wrong but never the token nor a claim's value; the little it quotes of a
/// header (alg, typ) passes through [`shown`], so the text is safe to log as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("the access token is not a signed JWT (three base64url parts)")]
    Malformed,
    #[error("the access token is longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error(
        "the access token's algorithm {0} is not accepted (RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA)"
    )]
    Algorithm(String),
    #[error("no key of the issuer's key set has the access token's kid")]
    UnknownKey,
    #[error("the access token's signature does not verify")]
    Signature,
    #[error("the access token was issued by another issuer")]
    Issuer,
    #[error("the access token is not meant for this server (its aud does not name {0})")]
    Audience(String),
    #[error("the access token has expired")]
    Expired,
    #[error("the access token is not valid yet")]
    NotYet,
    #[error("the access token has no exp")]
    NoExpiry,
    #[error("the access token has no {0} claim naming its user")]
    NoUser(String),
    #[error(
        "the access token's header has crit, naming extensions this server does not implement (tokens without crit are accepted)"
    )]
    Critical,
    #[error(
        "the access token's typ {0} is not accepted (at+jwt, application/at+jwt, JWT, or no typ)"
    )]
    Type(String),
    #[error(
        "the access token's {0} is not a NumericDate (a JSON number of seconds since 1970, 0 to {MAX_NUMERIC_DATE})"
    )]
    Date(&'static str),
    #[error(
        "the access token's {0} claim {1}; a user id is 1 to {MAX_USER_BYTES} bytes of printable text without bidi controls"
    )]
    BadUser(String, &'static str),
}

/// A value taken from a token, fit to be put in a refusal (which goes to the log and into a
/// `WWW-Authenticate` header): cut short, and printable ASCII only, everything else escaped,
/// so that a newline cannot forge a log line nor a bidi control reorder one.
fn shown(value: &str) -> String {
    value
        .chars()
        .take(16)
        .flat_map(char::escape_default)
        .collect()
}

/// One verification key of a set, as much of RFC 7517 as verifying needs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Jwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    usage: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

/// An issuer's published keys (its `jwks_uri`), bounded to [`MAX_KEYS`].
#[derive(Debug, Clone, Default)]
pub(crate) struct KeySet {
    keys: Vec<Jwk>,
}

impl KeySet {
    pub(crate) fn parse(document: &[u8]) -> Result<KeySet, String> {
        #[derive(Deserialize)]
        struct Document {
            keys: Vec<serde_json::Value>,
        }
        let document: Document = serde_json::from_slice(document)
            .map_err(|e| format!("not a JSON Web Key Set ({e})"))?;
        if document.keys.len() > MAX_KEYS {
            return Err(format!(
                "{} keys, more than the {MAX_KEYS} taken",
                document.keys.len()
            ));
        }
        // A key of a kind this server cannot use (an encryption key, an unknown kty) is
        // skipped, not a reason to refuse the set.
        let keys = document
            .keys
            .into_iter()
            .filter_map(|k| serde_json::from_value::<Jwk>(k).ok())
            .filter(|k| k.usage.as_deref().is_none_or(|u| u == "sig"))
            .collect();
        Ok(KeySet { keys })
    }

    pub(crate) fn has(&self, kid: Option<&str>) -> bool {
        self.keys
            .iter()
            .any(|k| kid.is_none() || k.kid.as_deref() == kid)
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

/// What a token must say to be taken.
#[derive(Debug, Clone)]
pub(crate) struct Expected {
    pub issuer: String,
    pub audience: String,
    pub user_claim: String,
}

/// What a valid token says about its bearer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verified {
    pub user: String,
    pub scopes: Vec<String>,
    pub expires_at: i64,
}

impl Verified {
    /// Whether the token is still good at `now`: a token checked before is held to its expiry
    /// again, as [`verify`] held it.
    pub(crate) fn unexpired_at(&self, now: i64) -> bool {
        unexpired(self.expires_at, now)
    }
}

fn unexpired(expires_at: i64, now: i64) -> bool {
    expires_at.saturating_add(LEEWAY_SECS) > now
}

struct Header {
    alg: String,
    kid: Option<String>,
    typ: Option<String>,
    /// Whether the header has `crit` at all, whatever its value.
    crit: bool,
}

impl Header {
    fn parse(bytes: &[u8]) -> Result<Header, TokenError> {
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(bytes).map_err(|_| TokenError::Malformed)?;
        // A null kid or typ is taken as absent, as serde's Option took them before.
        let text = |name: &str| match fields.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(TokenError::Malformed),
        };
        Ok(Header {
            alg: text("alg")?.ok_or(TokenError::Malformed)?,
            kid: text("kid")?,
            typ: text("typ")?,
            crit: fields.contains_key("crit"),
        })
    }

    /// RFC 7515 section 4.1.11: a `crit` names extensions the recipient must understand or
    /// refuse the token; this server implements none, so any `crit` (even an empty or null
    /// one, which the RFC forbids) is refused.
    ///
    /// `typ`: RFC 9068 section 4 asks a resource server to check it is `at+jwt`, so that
    /// another JWT of the issuer (an ID token, a logout token) cannot pass as an access token.
    /// Requiring it would shut out issuers whose access tokens are JWTs without the RFC 9068
    /// profile: Keycloak, Entra ID and Auth0's default profile send `JWT`, Cognito none
    /// (oidc-provider 9, which the sign-in client tests run, sends `at+jwt`). Those tokens are still bound to
    /// this server by `aud` (RFC 8707), which an ID token (aud: the client id) does not name.
    /// So `at+jwt` and the generic `JWT` (RFC 7519 section 5.1) or none are taken, and a
    /// type that says the token is for something else is refused. Compared as RFC 7515
    /// section 4.1.9 says: case-insensitive, `application/` optional.
    fn check(&self) -> Result<(), TokenError> {
        if self.crit {
            return Err(TokenError::Critical);
        }
        if let Some(typ) = &self.typ {
            let lower = typ.to_ascii_lowercase();
            let media = lower.strip_prefix("application/").unwrap_or(&lower);
            if !matches!(media, "at+jwt" | "jwt") {
                return Err(TokenError::Type(shown(typ)));
            }
        }
        Ok(())
    }
}

/// The header's `kid`, read before the signature is checked: which key to look for, and
/// whether the set needs fetching again.
pub(crate) fn key_id(token: &str) -> Result<Option<String>, TokenError> {
    let (header, _, _) = parts(token)?;
    Ok(header.kid)
}

fn parts(token: &str) -> Result<(Header, &str, &str), TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::TooLong);
    }
    let mut pieces = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (pieces.next(), pieces.next(), pieces.next(), pieces.next())
    else {
        return Err(TokenError::Malformed);
    };
    let header_bytes = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| TokenError::Malformed)?;
    Ok((Header::parse(&header_bytes)?, payload, signature))
}

/// The token checked whole at `now` (seconds since the epoch).
pub(crate) fn verify(
    token: &str,
    keys: &KeySet,
    expected: &Expected,
    now: i64,
) -> Result<Verified, TokenError> {
    let (header, payload, signature) = parts(token)?;
    let signed = &token[..token.len() - signature.len() - 1];
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| TokenError::Malformed)?;
    let algorithm = Algorithm::named(&header.alg)?;
    header.check()?;
    let candidates: Vec<&Jwk> = keys
        .keys
        .iter()
        .filter(|k| header.kid.is_none() || k.kid == header.kid)
        .filter(|k| k.alg.as_deref().is_none_or(|a| a == header.alg))
        .filter(|k| algorithm.fits(k))
        .collect();
    if candidates.is_empty() {
        return Err(TokenError::UnknownKey);
    }
    if !candidates
        .iter()
        .any(|k| algorithm.verifies(k, signed.as_bytes(), &signature))
    {
        return Err(TokenError::Signature);
    }
    let payload = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| TokenError::Malformed)?;
    let claims: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
    check_claims(&claims, expected, now)
}

fn check_claims(
    claims: &serde_json::Map<String, serde_json::Value>,
    expected: &Expected,
    now: i64,
) -> Result<Verified, TokenError> {
    // An issuer is a URL: the operator's `https://id.example/` and a token's
    // `https://id.example` name the same one.
    let issued_by = claims.get("iss").and_then(|v| v.as_str());
    if !issued_by.is_some_and(|iss| same_resource(iss, &expected.issuer)) {
        return Err(TokenError::Issuer);
    }
    let names_us = |v: &serde_json::Value| {
        v.as_str()
            .is_some_and(|a| same_resource(a, &expected.audience))
    };
    let audience_ok = match claims.get("aud") {
        Some(serde_json::Value::Array(list)) => list.iter().any(names_us),
        Some(one) => names_us(one),
        None => false,
    };
    if !audience_ok {
        return Err(TokenError::Audience(expected.audience.clone()));
    }
    // Rounded to the stricter side: a token ends at the whole second before its exp and
    // starts at the whole second after its nbf.
    let expires_at = numeric_date(claims, "exp", f64::floor)?.ok_or(TokenError::NoExpiry)?;
    if !unexpired(expires_at, now) {
        return Err(TokenError::Expired);
    }
    if let Some(not_before) = numeric_date(claims, "nbf", f64::ceil)?
        && not_before.saturating_sub(LEEWAY_SECS) > now
    {
        return Err(TokenError::NotYet);
    }
    // iat only says when the token was made; nbf is the claim that bars early use. It is
    // still held to the same form, so a token is not half-read.
    numeric_date(claims, "iat", f64::floor)?;
    let user = match claims.get(&expected.user_claim) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    if user.is_empty() {
        return Err(TokenError::NoUser(expected.user_claim.clone()));
    }
    if let Some(problem) = user_problem(&user) {
        return Err(TokenError::BadUser(expected.user_claim.clone(), problem));
    }
    // RFC 9068's `scope` (space-separated), or the `scp` list some issuers send instead.
    let scopes = match (claims.get("scope"), claims.get("scp")) {
        (Some(serde_json::Value::String(s)), _) => {
            s.split_ascii_whitespace().map(str::to_owned).collect()
        }
        (_, Some(serde_json::Value::Array(list))) => list
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    Ok(Verified {
        user,
        scopes,
        expires_at,
    })
}

/// The claim `name` as a NumericDate (RFC 7519 section 2: a JSON number of seconds, possibly
/// fractional), `round`ed to whole seconds; `None` when absent. A string, a negative or a
/// date past [`MAX_NUMERIC_DATE`] is refused, whichever claim it is.
fn numeric_date(
    claims: &serde_json::Map<String, serde_json::Value>,
    name: &'static str,
    round: fn(f64) -> f64,
) -> Result<Option<i64>, TokenError> {
    let Some(value) = claims.get(name) else {
        return Ok(None);
    };
    let seconds = match value {
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(whole) => Some(whole),
            // An integer past i64 (as_u64) is out of range below; a fraction is rounded once
            // it is known to be finite and in range, so the conversion cannot saturate.
            None if n.is_u64() => None,
            None => n
                .as_f64()
                .filter(|f| f.is_finite() && (0.0..=MAX_NUMERIC_DATE as f64).contains(f))
                .map(|f| round(f) as i64),
        },
        _ => None,
    };
    match seconds {
        Some(s) if (0..=MAX_NUMERIC_DATE).contains(&s) => Ok(Some(s)),
        _ => Err(TokenError::Date(name)),
    }
}

/// Why a user id would mislead whoever reads it (in the log, on a machine's owner), or `None`.
/// The id is shown as it is, so it must not hide (blanks), break a line (controls), reorder
/// the text around it (bidi controls), or pass for the operator.
fn user_problem(user: &str) -> Option<&'static str> {
    const BIDI: &[char] = &[
        '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}',
        '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
    ];
    if user.len() > MAX_USER_BYTES {
        Some("is too long")
    } else if user.trim() == OPERATOR_SHOWN {
        Some("reads (the operator), which is how the log shows the operator")
    } else if user.chars().all(char::is_whitespace) {
        Some("is only blanks")
    } else if user
        .chars()
        .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        Some("holds a control character or line separator")
    } else if user.contains(BIDI) {
        Some(
            "holds a Unicode bidi control (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069)",
        )
    } else {
        None
    }
}

/// RFC 8707 resources compare as URIs; an issuer that adds or drops the trailing slash of a
/// path still names the same server.
fn same_resource(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

#[derive(Clone, Copy)]
enum Algorithm {
    Rsa(&'static signature::RsaParameters),
    Ecdsa(&'static signature::EcdsaVerificationAlgorithm, &'static str),
    EdDsa,
}

impl Algorithm {
    /// Only asymmetric algorithms: `none` and the HMAC family (whose key would be a secret the
    /// issuer shares) are refused by name.
    fn named(alg: &str) -> Result<Algorithm, TokenError> {
        Ok(match alg {
            "RS256" => Algorithm::Rsa(&signature::RSA_PKCS1_2048_8192_SHA256),
            "RS384" => Algorithm::Rsa(&signature::RSA_PKCS1_2048_8192_SHA384),
            "RS512" => Algorithm::Rsa(&signature::RSA_PKCS1_2048_8192_SHA512),
            "PS256" => Algorithm::Rsa(&signature::RSA_PSS_2048_8192_SHA256),
            "PS384" => Algorithm::Rsa(&signature::RSA_PSS_2048_8192_SHA384),
            "PS512" => Algorithm::Rsa(&signature::RSA_PSS_2048_8192_SHA512),
            "ES256" => Algorithm::Ecdsa(&signature::ECDSA_P256_SHA256_FIXED, "P-256"),
            "ES384" => Algorithm::Ecdsa(&signature::ECDSA_P384_SHA384_FIXED, "P-384"),
            "EdDSA" => Algorithm::EdDsa,
            other => return Err(TokenError::Algorithm(shown(other))),
        })
    }

    fn fits(self, key: &Jwk) -> bool {
        match self {
            Algorithm::Rsa(_) => key.kty == "RSA",
            Algorithm::Ecdsa(_, curve) => key.kty == "EC" && key.crv.as_deref() == Some(curve),
            Algorithm::EdDsa => key.kty == "OKP" && key.crv.as_deref() == Some("Ed25519"),
        }
    }

    fn verifies(self, key: &Jwk, message: &[u8], sig: &[u8]) -> bool {
        let decode =
            |part: &Option<String>| part.as_deref().and_then(|p| URL_SAFE_NO_PAD.decode(p).ok());
        match self {
            Algorithm::Rsa(parameters) => {
                let (Some(n), Some(e)) = (decode(&key.n), decode(&key.e)) else {
                    return false;
                };
                signature::RsaPublicKeyComponents { n: &n, e: &e }
                    .verify(parameters, message, sig)
                    .is_ok()
            }
            Algorithm::Ecdsa(algorithm, _) => {
                let (Some(x), Some(y)) = (decode(&key.x), decode(&key.y)) else {
                    return false;
                };
                let mut point = Vec::with_capacity(1 + x.len() + y.len());
                point.push(0x04);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                signature::UnparsedPublicKey::new(algorithm, &point)
                    .verify(message, sig)
                    .is_ok()
            }
            Algorithm::EdDsa => {
                let Some(x) = decode(&key.x) else {
                    return false;
                };
                signature::UnparsedPublicKey::new(&signature::ED25519, &x)
                    .verify(message, sig)
                    .is_ok()
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair as _};

    /// An ES256 issuer made in the test: its key set and a signer of tokens.
    pub(crate) struct TestIssuer {
        key: EcdsaKeyPair,
        pub kid: String,
    }

    impl TestIssuer {
        pub(crate) fn new(kid: &str) -> TestIssuer {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                    .unwrap();
            let key = EcdsaKeyPair::from_pkcs8(
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                pkcs8.as_ref(),
                &rng,
            )
            .unwrap();
            TestIssuer {
                key,
                kid: kid.to_owned(),
            }
        }

        pub(crate) fn jwks(&self) -> serde_json::Value {
            let point = self.key.public_key().as_ref();
            serde_json::json!({"keys": [{
                "kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig", "alg": "ES256",
                "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
            }]})
        }

        pub(crate) fn sign(&self, claims: &serde_json::Value) -> String {
            self.sign_with_header(
                &serde_json::json!({"alg": "ES256", "kid": self.kid, "typ": "at+jwt"}),
                claims,
            )
        }

        pub(crate) fn sign_with_header(
            &self,
            header: &serde_json::Value,
            claims: &serde_json::Value,
        ) -> String {
            let signed = format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(header.to_string()),
                URL_SAFE_NO_PAD.encode(claims.to_string())
            );
            let sig = self
                .key
                .sign(&SystemRandom::new(), signed.as_bytes())
                .unwrap();
            format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
        }
    }

    const NOW: i64 = 1_800_000_000;

    fn expected() -> Expected {
        Expected {
            issuer: "https://id.example".into(),
            audience: "https://smol.example/mcp".into(),
            user_claim: "sub".into(),
        }
    }

    fn claims() -> serde_json::Value {
        serde_json::json!({
            "iss": "https://id.example", "aud": "https://smol.example/mcp", "sub": "alice",
            "exp": NOW + 300, "iat": NOW, "scope": "openid machines",
        })
    }

    fn keys(issuer: &TestIssuer) -> KeySet {
        KeySet::parse(issuer.jwks().to_string().as_bytes()).unwrap()
    }

    #[test]
    fn a_good_token_names_its_user_and_scopes() {
        let issuer = TestIssuer::new("k1");
        let verified = verify(&issuer.sign(&claims()), &keys(&issuer), &expected(), NOW).unwrap();
        assert_eq!(verified.user, "alice");
        assert_eq!(verified.scopes, ["openid", "machines"]);
        assert_eq!(verified.expires_at, NOW + 300);
    }

    #[test]
    fn each_wrong_claim_is_refused_by_name() {
        let issuer = TestIssuer::new("k1");
        let keys = keys(&issuer);
        let with = |key: &str, value: serde_json::Value| {
            let mut c = claims();
            c[key] = value;
            verify(&issuer.sign(&c), &keys, &expected(), NOW)
        };
        assert_eq!(
            with("iss", "https://evil.example".into()),
            Err(TokenError::Issuer)
        );
        assert_eq!(
            with("iss", "https://id.example.evil".into()),
            Err(TokenError::Issuer)
        );
        assert!(with("iss", "https://id.example/".into()).is_ok());
        assert_eq!(
            with("aud", "https://other.example/mcp".into()),
            Err(TokenError::Audience("https://smol.example/mcp".into()))
        );
        assert!(with("aud", serde_json::json!(["x", "https://smol.example/mcp/"])).is_ok());
        assert_eq!(with("exp", (NOW - 61).into()), Err(TokenError::Expired));
        assert!(with("exp", (NOW - 30).into()).is_ok(), "within the leeway");
        assert_eq!(with("nbf", (NOW + 120).into()), Err(TokenError::NotYet));
        assert_eq!(
            with("sub", "".into()),
            Err(TokenError::NoUser("sub".into()))
        );
        let mut c = claims();
        c.as_object_mut().unwrap().remove("exp");
        assert_eq!(
            verify(&issuer.sign(&c), &keys, &expected(), NOW),
            Err(TokenError::NoExpiry)
        );
    }

    #[test]
    fn a_tenant_claim_can_name_the_user() {
        let issuer = TestIssuer::new("k1");
        let mut c = claims();
        c["org"] = "acme".into();
        let expected = Expected {
            user_claim: "org".into(),
            ..expected()
        };
        assert_eq!(
            verify(&issuer.sign(&c), &keys(&issuer), &expected, NOW)
                .unwrap()
                .user,
            "acme"
        );
    }

    #[test]
    fn forged_and_unsigned_tokens_are_refused() {
        let issuer = TestIssuer::new("k1");
        let other = TestIssuer::new("k1");
        let keys = keys(&issuer);
        // Signed by another key under the same kid.
        assert_eq!(
            verify(&other.sign(&claims()), &keys, &expected(), NOW),
            Err(TokenError::Signature)
        );
        // The payload changed after signing.
        let token = issuer.sign(&claims());
        let mut pieces: Vec<&str> = token.split('.').collect();
        let mut c = claims();
        c["sub"] = "bob".into();
        let forged = URL_SAFE_NO_PAD.encode(c.to_string());
        pieces[1] = &forged;
        assert_eq!(
            verify(&pieces.join("."), &keys, &expected(), NOW),
            Err(TokenError::Signature)
        );
        // alg none, and HMAC (whose key would be the public key taken as a secret).
        for alg in ["none", "HS256"] {
            let token =
                issuer.sign_with_header(&serde_json::json!({"alg": alg, "kid": "k1"}), &claims());
            assert_eq!(
                verify(&token, &keys, &expected(), NOW),
                Err(TokenError::Algorithm(alg.into()))
            );
        }
        // An unknown kid; garbage; a huge token.
        let stray = TestIssuer::new("k2");
        assert_eq!(
            verify(&stray.sign(&claims()), &keys, &expected(), NOW),
            Err(TokenError::UnknownKey)
        );
        assert_eq!(
            verify("a.b", &keys, &expected(), NOW),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            verify(&"a".repeat(MAX_TOKEN_BYTES + 1), &keys, &expected(), NOW),
            Err(TokenError::TooLong)
        );
    }

    #[test]
    fn eddsa_keys_verify_and_do_not_pass_for_ecdsa() {
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let jwks = serde_json::json!({"keys": [{
            "kty": "OKP", "crv": "Ed25519", "kid": "ed",
            "x": URL_SAFE_NO_PAD.encode(key.public_key().as_ref()),
        }]});
        let keys = KeySet::parse(jwks.to_string().as_bytes()).unwrap();
        let sign = |alg: &str| {
            let signed = format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(serde_json::json!({"alg": alg, "kid": "ed"}).to_string()),
                URL_SAFE_NO_PAD.encode(claims().to_string())
            );
            format!(
                "{signed}.{}",
                URL_SAFE_NO_PAD.encode(key.sign(signed.as_bytes()).as_ref())
            )
        };
        assert!(verify(&sign("EdDSA"), &keys, &expected(), NOW).is_ok());
        assert_eq!(
            verify(&sign("ES256"), &keys, &expected(), NOW),
            Err(TokenError::UnknownKey)
        );
    }

    /// The token of [`claims`] changed by `edit`, signed with `header`, verified at [`NOW`].
    fn verify_edited(
        header: serde_json::Value,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> Result<Verified, TokenError> {
        let issuer = TestIssuer::new("k1");
        let mut c = claims();
        edit(&mut c);
        let mut h = serde_json::json!({"alg": "ES256", "kid": "k1"});
        for (k, v) in header.as_object().unwrap() {
            h[k] = v.clone();
        }
        verify(
            &issuer.sign_with_header(&h, &c),
            &keys(&issuer),
            &expected(),
            NOW,
        )
    }

    fn refusal(result: Result<Verified, TokenError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn a_token_typed_for_another_use_is_refused() {
        for typ in ["at+jwt", "AT+JWT", "application/at+jwt", "JWT", "jwt"] {
            assert!(
                verify_edited(serde_json::json!({"typ": typ}), |_| {}).is_ok(),
                "{typ}"
            );
        }
        assert!(verify_edited(serde_json::json!({}), |_| {}).is_ok());
        for typ in [
            "logout+jwt",
            "dpop+jwt",
            "secevent+jwt",
            "JWE",
            "application/at+jwt+x",
        ] {
            let e = refusal(verify_edited(serde_json::json!({"typ": typ}), |_| {}));
            assert!(e.contains("typ") && e.contains("at+jwt"), "{typ}: {e}");
        }
    }

    #[test]
    fn any_crit_header_is_refused() {
        for crit in [
            serde_json::json!(["exp"]),
            serde_json::json!(["b64"]),
            serde_json::json!([]),
            serde_json::Value::Null,
        ] {
            let e = refusal(verify_edited(serde_json::json!({"crit": crit}), |_| {}));
            assert!(e.contains("crit"), "{crit}: {e}");
        }
    }

    #[test]
    fn numeric_dates_are_json_numbers_in_range() {
        let with = |key: &str, value: serde_json::Value| {
            verify_edited(serde_json::json!({}), |c| c[key] = value)
        };
        // Fractional seconds are a NumericDate (RFC 7519 section 2); rounded to the stricter
        // side: an exp down, an nbf up.
        assert_eq!(
            with("exp", serde_json::json!(NOW as f64 + 300.75))
                .unwrap()
                .expires_at,
            NOW + 300
        );
        assert!(with("nbf", serde_json::json!(NOW as f64 - 0.5)).is_ok());
        assert!(with("iat", serde_json::json!(NOW as f64 - 0.5)).is_ok());
        assert_eq!(
            with("nbf", serde_json::json!(NOW as f64 + 120.5)),
            Err(TokenError::NotYet)
        );
        for key in ["exp", "nbf", "iat"] {
            for bad in [
                serde_json::json!((NOW + 300).to_string()),
                serde_json::json!("soon"),
                serde_json::json!(true),
                serde_json::json!([NOW]),
                serde_json::Value::Null,
                serde_json::json!(-1),
                serde_json::json!(-0.5),
                serde_json::json!(1e300),
                serde_json::json!(u64::MAX),
                serde_json::json!(253_402_300_800_i64),
            ] {
                let e = refusal(with(key, bad.clone()));
                assert!(
                    e.contains(key) && e.contains("NumericDate"),
                    "{key} {bad}: {e}"
                );
            }
        }
    }

    #[test]
    fn date_arithmetic_cannot_overflow() {
        let with = |key: &str, value: i64| {
            std::panic::catch_unwind(|| {
                verify_edited(serde_json::json!({}), |c| c[key] = value.into()).is_err()
            })
        };
        for (key, value) in [
            ("exp", i64::MAX),
            ("exp", i64::MIN),
            ("nbf", i64::MIN),
            ("nbf", i64::MAX),
            ("iat", i64::MIN),
        ] {
            assert_eq!(with(key, value).ok(), Some(true), "{key} {value}");
        }
        // `now` comes from the clock; a clock at either end of time must not panic either.
        let issuer = TestIssuer::new("k1");
        let mut c = claims();
        c["nbf"] = NOW.into();
        let token = issuer.sign(&c);
        assert_eq!(
            verify(&token, &keys(&issuer), &expected(), i64::MIN),
            Err(TokenError::NotYet)
        );
        assert_eq!(
            verify(&token, &keys(&issuer), &expected(), i64::MAX),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn a_user_that_would_mislead_a_reader_is_refused() {
        let with = |user: &str| {
            let user = user.to_owned();
            verify_edited(serde_json::json!({}), move |c| c["sub"] = user.into())
        };
        for (user, reason) in [
            ("   ", "blank"),
            ("\u{3000}\t", "blank"),
            ("alice\nINFO signed in: root", "control"),
            ("a\u{7f}", "control"),
            ("a\u{2028}b", "control"),
            ("admin\u{202E}nimda", "bidi"),
            ("\u{202A}x", "bidi"),
            ("x\u{2066}", "bidi"),
            ("x\u{2069}", "bidi"),
            ("x\u{200E}", "bidi"),
            ("x\u{200F}", "bidi"),
            ("x\u{061C}", "bidi"),
            ("(the operator)", "operator"),
            (" (the operator) ", "operator"),
        ] {
            let e = refusal(with(user));
            assert!(e.contains("sub") && e.contains(reason), "{user:?}: {e}");
        }
        assert!(with(&"a".repeat(257)).is_err());
        assert_eq!(with("alice bob").unwrap().user, "alice bob");
        assert_eq!(with("zoë@例え.jp").unwrap().user, "zoë@例え.jp");
    }

    #[test]
    fn values_from_the_token_are_escaped_in_refusals() {
        for header in [
            serde_json::json!({"alg": "RS256\nINFO forged"}),
            serde_json::json!({"alg": "\u{202E}652SR"}),
            serde_json::json!({"typ": "at+jwt\r\nINFO forged"}),
        ] {
            let e = refusal(verify_edited(header.clone(), |_| {}));
            assert!(
                e.chars().all(|c| c == ' ' || c.is_ascii_graphic()),
                "{header}: {e:?}"
            );
        }
    }

    #[test]
    fn a_key_set_is_bounded_and_skips_what_it_cannot_use() {
        let many =
            serde_json::json!({"keys": vec![serde_json::json!({"kty": "EC"}); MAX_KEYS + 1]});
        assert!(KeySet::parse(many.to_string().as_bytes()).is_err());
        let mixed = serde_json::json!({"keys": [
            {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "crv": "P-256", "kid": "a", "x": "", "y": ""},
            {"nonsense": true},
        ]});
        let keys = KeySet::parse(mixed.to_string().as_bytes()).unwrap();
        assert_eq!(keys.len(), 1);
        assert!(keys.has(Some("a")) && !keys.has(Some("b")));
        assert!(KeySet::parse(b"[]").is_err());
    }
}
