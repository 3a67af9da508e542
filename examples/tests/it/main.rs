//! coord-examples' tests, one binary: every example program runs on every
//! store (`examples_run`), and the `coord` facade is called as a user's
//! program calls it: `connect` by URL (`facade`) and the blocking API from
//! plain threads (`blocking`).

mod blocking;
mod dashboard;
mod examples_run;
mod facade;
