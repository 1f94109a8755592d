// Package taskpage is a sample task page in front of a humantask.Service:
// server-rendered HTML (html/template, no JavaScript, like the operator console) that
// lists the caller's user tasks and completes one through Service.Complete.
//
//	GET  /ui/                 the caller's tasks
//	GET  /ui/tasks/{id}       one task's form: its form variables as inputs, and two
//	                          hidden fields, a command id minted when the form renders
//	                          (128 random bits) and the task's ETag (If-Match)
//	POST /ui/tasks/{id}       completes it and shows the answer, with its status
//
// The command id belongs to the rendered form, not to the click: a double click, a
// browser's resubmit and a resubmit after the back button (the form page is cached for
// history navigation, so the back button brings the same form, the same id) are one
// command, and get one answer, the same page each time. Loading the form again is a new
// command.
//
// The answers read as pages: completed (200); "already completed by X at T" (409); "this
// task changed since you opened it; reload it" (412); "not yours" (403); the business
// rule's reason (422); "not settled yet, send the form again" (503).
//
// Who sends a request is the same humantask.IdentitySource the service uses: behind a
// reverse proxy that authenticates users (humantask.ProxyHeader), or a proxy that passes
// a bearer token on (humantask.JWT). A browser sends no token of its own.
//
// A form post from another origin completes nothing (403): the post's Sec-Fetch-Site,
// when sent, must be same-origin, and its Origin and Referer, when sent, must name the
// page's own host. Pages forbid framing and scripts (Content-Security-Policy).
package taskpage
