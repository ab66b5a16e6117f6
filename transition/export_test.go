package transition

// InsertSQL is Insert's statement (for the plan test).
const InsertSQL = insertSQL
