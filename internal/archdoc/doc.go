// Package archdoc owns the check that the documentation states the code's
// facts as they are. Its tests read the module's non-test Go files, the
// migrations and the Markdown documents, and fail on drift:
//
//   - docs/ARCHITECTURE.md §8: every package of the module has a row, no
//     row names a package that does not exist, and each row's import
//     column lists exactly the module packages the package imports;
//   - every migration range written as "00001–000NN" spans exactly the
//     files in migrations/, and docs/ARCHITECTURE.md §3 has one row per
//     migration;
//   - every relative link of README.md and docs/*.md names a file of the
//     repository, and every #anchor a heading of the linked document.
//
// The import column and the package rows are generated: after a change of
// imports or packages,
//
//	INGEST_UPDATE_DOCS=1 go test ./internal/archdoc
//
// rewrites them in place (a new package's row takes the first sentence of
// its package documentation as what it owns).
//
// The package also owns the convention for other generated parts of the
// documents (CheckGenerated): a region between two HTML comments, the
// first naming the command that regenerates it, compared with what a test
// generates from the code and rewritten in place when UpdateEnv is 1.
package archdoc
