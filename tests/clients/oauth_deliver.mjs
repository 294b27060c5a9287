// The browser a client hands its sign-in to (the Inspector CLI prints "Please navigate to"):
// opens the URL as `user` and brings the code to the client's loopback callback.
//
// Arguments: authorization URL, user, the callback's URL prefix.
import { signInAs } from './oauth_browser.mjs';

const [url, user, callback] = process.argv.slice(2);
await signInAs(url, user, callback, { deliver: true });
process.stdout.write(JSON.stringify({ delivered: true }) + '\n');
