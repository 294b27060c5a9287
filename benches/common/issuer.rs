//! The benches' own OAuth issuer: its metadata and key set served on loopback, its access
//! tokens (ES256) signed here with a key made by ring. What a sign-in bench measures is then the
//! server's side only, with no identity provider to install or wait for.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::json;

pub struct Issuer {
    pub url: String,
    key: EcdsaKeyPair,
}

impl Issuer {
    pub async fn start() -> Issuer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let point = key.public_key().as_ref().to_vec();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let metadata = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
        let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "bench", "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])}]});
        let router = axum::Router::new()
            .route(
                "/.well-known/oauth-authorization-server",
                axum::routing::get(move || {
                    let m = metadata.clone();
                    async move { axum::Json(m) }
                }),
            )
            .route(
                "/jwks",
                axum::routing::get(move || {
                    let k = jwks.clone();
                    async move { axum::Json(k) }
                }),
            );
        tokio::spawn(async move { axum::serve(listener, router).await });
        Issuer { url, key }
    }

    /// An access token for `user` naming `audience` (the server's URL as clients dial it), with
    /// the scope `machines`, valid for an hour.
    pub fn token(&self, user: &str, audience: &str) -> String {
        let header = json!({"alg": "ES256", "kid": "bench", "typ": "at+jwt"});
        let claims = json!({"iss": self.url, "aud": audience, "sub": user, "scope": "machines",
            "exp": chrono::Utc::now().timestamp() + 3600});
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
