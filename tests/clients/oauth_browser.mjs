// The "browser" of the sign-in tests: opens an authorization URL as a person would, signing in
// as `user` (sent as login_hint; the test provider's pages answer themselves), and follows the
// redirects with the cookies they set until one goes to `redirectPrefix`. That last address
// (carrying the code) is answered, or, with `deliver`, requested too: a client's loopback
// callback listener (the Inspector's) receives it as from a browser.
export async function signInAs(authorizationUrl, user, redirectPrefix, { deliver = false } = {}) {
  const url = new URL(authorizationUrl);
  url.searchParams.set('login_hint', user);
  const cookies = new Map();
  let next = url.href;
  for (let hop = 0; hop < 20; hop++) {
    if (next.startsWith(redirectPrefix)) {
      if (deliver) {
        const delivered = await fetch(next);
        if (!delivered.ok) throw new Error(`the callback answered ${delivered.status}`);
      }
      return next;
    }
    const response = await fetch(next, {
      redirect: 'manual',
      headers: { cookie: [...cookies].map(([k, v]) => `${k}=${v}`).join('; ') },
    });
    for (const line of response.headers.getSetCookie()) {
      const [pair] = line.split(';');
      const at = pair.indexOf('=');
      cookies.set(pair.slice(0, at).trim(), pair.slice(at + 1));
    }
    const location = response.headers.get('location');
    if (!location) {
      throw new Error(`sign-in stopped at ${next}: ${response.status} ${await response.text()}`);
    }
    next = new URL(location, next).href;
  }
  throw new Error('sign-in went through more than 20 redirects');
}
