// Package helm pins the Helm release the chart tests lint, render and install
// charts/linkpack with; see go.mod.
package helm
