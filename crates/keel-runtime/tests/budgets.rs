//! budgets
