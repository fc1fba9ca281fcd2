// Package prefixstats holds lockd's bounded per-template statistics (C4
// #ct4-template-stats, C5 #ct5-stats): waits, holds and queue lengths with
// one label, template, whose values are the operator's key templates (or,
// by default, the first path segment of keys), never keys.
//
// The number of label values is bounded when the configuration is read
// (MaxTemplates declared templates, MaxTemplates first segments by default,
// plus Other), so the series these metrics add stay within MaxSeries
// whatever the keys and sessions. Matching a key and observing a value
// allocate nothing once a template's series exist.
package prefixstats
